"""Fixtures: a real mock server process on a free loopback port."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest


def start_mock(ttft_ms: float = 0.0, itl_ms: float = 0.0, retry_after: float = 0.0) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "admit.loadgen.mockserver",
            "--port",
            "0",
            "--ttft-ms",
            str(ttft_ms),
            "--itl-ms",
            str(itl_ms),
            "--retry-after",
            str(retry_after),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60  # generous: it only bounds a process that never starts
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.1):
                line = proc.stdout.readline()
                if line.startswith("listening on "):
                    return proc, "http://" + line.split()[-1]
            if proc.poll() is not None:
                break
    proc.kill()
    proc.wait(5)
    proc.stdout.close()
    raise RuntimeError("mock server did not start")


@pytest.fixture
def mock_server() -> Iterator[Callable[..., str]]:
    procs: list[subprocess.Popen] = []

    def factory(**kw: float) -> str:
        proc, url = start_mock(**kw)
        procs.append(proc)
        return url

    yield factory
    for p in procs:
        p.terminate()
        p.wait(timeout=10)
        p.stdout.close()  # the pipe start_mock read "listening on" from


@pytest.fixture
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


os.environ.setdefault("PYTHONHASHSEED", "0")

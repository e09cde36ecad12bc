"""Fixtures: a real mock server process on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from proc_helpers import read_listening


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
    return proc, read_listening(proc, 60, "mock server")  # generous: it only bounds a hang


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

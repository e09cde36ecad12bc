"""Start a real emulator process on a free loopback port and talk to it over HTTP (helpers for the tests)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proc_helpers import read_listening
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Emulator:
    proc: subprocess.Popen[str]
    url: str

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        assert parts.hostname is not None and parts.port is not None
        return parts.hostname, parts.port

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        status, _, data = self.request_full(method, path, body, raw, headers)
        return status, data

    def request_full(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                     headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """Status, response headers (lower-case names) and body."""
        conn = http.client.HTTPConnection(*self.host_port, timeout=30)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        status, data = self.request(method, path, body, headers=headers)
        return status, json.loads(data) if data else None

    def metrics(self) -> dict[str, list[Any]]:
        """Samples by sample name (``vllm:foo_bucket`` etc.), parsed with prometheus_client's parser."""
        status, text = self.request("GET", "/metrics")
        assert status == 200
        out: dict[str, list[Any]] = {}
        for fam in text_string_to_metric_families(text.decode()):
            for s in fam.samples:
                out.setdefault(s.name, []).append(s)
        return out

    def value(self, name: str, **labels: str) -> float:
        for s in self.metrics()[name]:
            if all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise KeyError((name, labels))

    def wait_for(self, pred: Any, timeout: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_emulator(*args: str, wait_ready: bool = True, env: dict[str, str] | None = None) -> Emulator:
    """``python -m admit.emulator --port 0 ARGS``; returns once it listens (and, by default, is healthy).

    ``env``: variables added to this process's environment for the emulator (e.g. its admin token)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "admit.emulator", "--port", "0", *args], stdout=subprocess.PIPE, text=True,
        env=None if env is None else {**os.environ, **env},
    )
    url = read_listening(proc, 60, "the emulator")
    emu = Emulator(proc, url)
    if wait_ready:
        emu.wait_for(lambda: emu.request("GET", "/health")[0] == 200, 30.0, "/health to answer 200")
    return emu

"""Every line the gateway process writes passes its log's rate limit, uvicorn's own warnings included: a
thousand anonymous requests that make uvicorn warn (a websocket ``Upgrade`` the gateway does not serve, bytes
that are not HTTP) write a bounded number of lines, the rest are counted, and the next line of each kind says
how many of it were left out. A real gateway process in front of the project's mock backend."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_helpers import CountingMock, GatewayProcess, tenant_cfg, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

PER_S = 1.0  # lines a second per kind; a burst of 10
UPGRADE = (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
GARBAGE = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n"
KINDS = ("Unsupported upgrade request.", "No supported WebSocket library detected", "Invalid HTTP request received.")


@pytest.fixture
def gw(mock: CountingMock, tmp_path: Path) -> Iterator[GatewayProcess]:
    g = GatewayProcess(tmp_path, mock.url, {"log_lines_per_s": PER_S, "tenants": [tenant_cfg("a")]})
    yield g
    g.stop()


def poke(url: str, data: bytes) -> None:
    """Send ``data`` on a fresh connection and read until the gateway answers or closes it."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass


def metric(g: GatewayProcess, name: str) -> float:
    for line in g.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_uvicorns_warnings_cannot_flood_the_log(gw: GatewayProcess) -> None:
    before = len(gw.stderr().encode())
    t0 = time.monotonic()
    for _ in range(1000):
        poke(gw.url, UPGRADE)
        poke(gw.url, GARBAGE)
    elapsed = time.monotonic() - t0
    text = gw.stderr()
    counts = {k: text.count(k) for k in KINDS}
    allowed = 10 + PER_S * elapsed + 1  # a kind's burst and its refill over the flood
    assert 1 <= counts[KINDS[0]] <= allowed and 1 <= counts[KINDS[2]] <= allowed, (counts, elapsed)
    assert counts[KINDS[1]] <= allowed, (counts, elapsed)
    written = len(text.encode()) - before
    assert written <= 3 * allowed * 300, (written, counts)  # 3,000 lines of 60-180 bytes without the limit
    left_out = wait_for(lambda: metric(gw, "admit_gateway_log_lines_suppressed_total") or None, 30, "the count")
    assert left_out >= 3000 - 3 * allowed, (left_out, counts)
    # a kind's next line that passes says how many of it were left out
    def says_how_many() -> bool:
        poke(gw.url, GARBAGE)
        return "more line(s) like this left out" in gw.stderr()

    wait_for(says_how_many, 30, "a line that counts what was left out", every=0.5)
    assert "Traceback" not in gw.stderr()

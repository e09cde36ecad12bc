"""The mock server's side routes that the benchmark relies on: /health and /stats with arrival times."""

from __future__ import annotations

import http.client
import json
from time import monotonic_ns
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


def get(url: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def test_health_and_stats_count_arrivals_on_the_monotonic_clock(mock_server) -> None:
    url = mock_server()
    assert get(url, "/health")[0] == 200
    before = monotonic_ns()
    for _ in range(3):
        status, _ = get(url, "", {"model": "mock", "prompt": "hi", "max_tokens": 2, "stream": True})
        assert status == 200
    after = monotonic_ns()
    st = json.loads(get(url, "/stats?reset")[1])
    assert st["requests"] == 3 and st["streams_done"] == 3
    assert before <= st["first_ns"] <= st["last_ns"] <= after  # CLOCK_MONOTONIC is shared by processes
    st = json.loads(get(url, "/stats")[1])
    assert st == {"requests": 0, "streams_done": 0, "first_ns": 0, "last_ns": 0}

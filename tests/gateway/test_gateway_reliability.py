"""The gateway under hostile or broken clients: every connection bounded, every value checked, every error JSON.

Each test here is one of the defects a probe of the live gateway found, checked against a real
gateway process on loopback with raw sockets where HTTP clients would hide the bytes: a head of any size,
heads and bodies that never end, connections that never speak, more connections than file descriptors,
bytes that are not HTTP, JSON nested a thousand deep, envelope values no bucket can hold, token envelopes
dodged by leaving out ``max_tokens``, anonymous requests filling the log, a restart forgetting run-time
limits. Each asserts a JSON answer (or the documented silent close) and a gateway that still serves.
"""

from __future__ import annotations

import http.client as hc
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from emulator_helpers import start_emulator
from gateway_helpers import ADMIN_TOKEN, CountingMock, GatewayProcess, http, key, tenant_cfg, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

TIGHT = {"head_timeout_s": 2, "body_timeout_s": 2, "idle_timeout_s": 2}


@pytest.fixture(scope="module")
def gw(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Default connection bounds (32 KiB heads, 10 s head deadline, 30 s body and idle)."""
    cfg = {"tenants": [tenant_cfg("a", limit=8), tenant_cfg("b", limit=8)]}
    g = GatewayProcess(tmp_path_factory.mktemp("gw"), mock.url, cfg)
    yield g
    g.stop()


@pytest.fixture(scope="module")
def tight(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Two-second head, body and idle deadlines, so that the deadline tests take seconds."""
    cfg = {"connections": TIGHT, "tenants": [tenant_cfg("a", limit=8)]}
    g = GatewayProcess(tmp_path_factory.mktemp("tight"), mock.url, cfg)
    yield g
    g.stop()


def addr(g: GatewayProcess) -> tuple[str, int]:
    host, port = g.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def connect(g: GatewayProcess, timeout: float = 30.0) -> socket.socket:
    s = socket.create_connection(addr(g), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response from the socket (http.client's parser on the raw connection)."""
    r = hc.HTTPResponse(s)
    r.begin()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def assert_json_error(status: int, headers: dict[str, str], body: bytes, want_status: int, reason: str) -> dict:
    assert status == want_status, (status, body[:300])
    assert headers.get("content-type") == "application/json", headers
    doc = json.loads(body)
    assert doc["reason"] == reason == headers["x-admit-reason"] == doc["error"]["code"], doc
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"]
    return doc


def serves(g: GatewayProcess, tenant: str = "a") -> None:
    """A valid completion is answered 200 (a connection closed as idle by a stalled test is retried)."""
    for attempt in range(3):
        try:
            status, _, body = http("POST", g.url + "/v1/completions", {"model": "mock", "prompt": "x", "max_tokens": 2},
                                   {"Authorization": f"Bearer {key(tenant)}"}, timeout=30)
        except (hc.RemoteDisconnected, ConnectionResetError):
            if attempt == 2:
                raise
            continue
        assert status == 200, body[:300]
        return


def strict_json(data: bytes) -> Any:
    """json.loads that refuses NaN and Infinity, as strict parsers (JavaScript's, Go's) do."""
    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(data, parse_constant=refuse)


# ----------------------------------------------------------------- 1. head size
def test_a_head_over_the_bound_is_answered_431(gw: GatewayProcess) -> None:
    with connect(gw) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
        assert_json_error(*read_response(s), 431, "head-too-large")
    serves(gw)
    assert 'admit_gateway_connection_events_total{event="head-too-large"}' in gw.metrics()


def test_a_huge_head_is_cut_off_before_it_is_buffered(gw: GatewayProcess) -> None:
    """64 MB of one header, with no key: the gateway stops reading at 32 KiB and closes; its memory stays put
    (the unguarded gateway buffered all of it: +515 MB for a 256 MB header)."""
    rss0 = gw.rss_bytes()
    sent = 0
    chunk = b"b" * (1 << 20)
    with connect(gw) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Huge: ")
        try:
            while sent < 64 << 20:
                s.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert sent < 48 << 20, f"the gateway took {sent >> 20} MB of one header without closing"
    growth = gw.rss_bytes() - rss0
    assert growth < 24 << 20, f"the gateway grew by {growth >> 20} MB"
    serves(gw)


def test_headers_under_the_bound_pass(gw: GatewayProcess) -> None:
    with connect(gw) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Fine: " + b"c" * 20_000 + b"\r\n\r\n")
        status, _, body = read_response(s)
    assert status == 200 and json.loads(body) == {"status": "ok"}


# ----------------------------------------------------------------- 2. deadlines, idle time, connection count
def test_a_head_that_never_ends_is_answered_408(tight: GatewayProcess) -> None:
    with connect(tight) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head goes on for ever
        got = read_response(s)
        elapsed = time.monotonic() - t0
    assert_json_error(*got, 408, "head-timeout")
    assert elapsed >= 1.9, elapsed  # the deadline (2 s) started after this client's first byte was sent


def test_a_body_that_never_ends_is_answered_408_and_logged(tight: GatewayProcess) -> None:
    with connect(tight) as s:
        t0 = time.monotonic()
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key('a')}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":".encode())
        got = read_response(s)
        elapsed = time.monotonic() - t0
    assert_json_error(*got, 408, "body-timeout")
    assert elapsed >= 1.9, elapsed
    line = wait_for(lambda: next((x for x in tight.request_log() if x["outcome"] == "body-timeout"), None), 10,
                    "the request-log line of the timed-out body")
    assert line["tenant"] == "a" and line["status"] == 408
    assert 'admit_gateway_requests_total{outcome="body-timeout",tenant="a"} 1.0' in tight.metrics()
    assert tight.state()["requests_in_progress"] == 0
    serves(tight)


def test_an_idle_connection_is_closed_before_its_first_request(tight: GatewayProcess) -> None:
    with connect(tight) as s:
        t0 = time.monotonic()
        assert s.recv(1) == b""  # closed by the gateway, silently (as after a keep-alive answer)
        elapsed = time.monotonic() - t0
    assert elapsed >= 1.9, elapsed
    assert 'admit_gateway_connection_events_total{event="idle-timeout"}' in tight.metrics()


def test_idle_connections_cannot_take_every_file_descriptor(mock: CountingMock, tmp_path: Path) -> None:
    """256 file descriptors, 300 idle connections: valid requests are still served (idle ones are evicted,
    oldest first); the unguarded gateway ran out of descriptors and refused every request."""
    g = GatewayProcess(tmp_path, mock.url, {"tenants": [tenant_cfg("a", limit=8)]}, max_open_files=256)
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            idle.append(connect(g))
        for _ in range(20):
            serves(g)
        assert float(_metric(g.metrics(), 'admit_gateway_connection_events_total{event="evicted-idle"}')) >= 150
        assert float(_metric(g.metrics(), "admit_gateway_connections")) <= 128  # the default cap for 256 files
    finally:
        for s in idle:
            s.close()
        g.stop()


def test_busy_connections_past_the_cap_get_503(tmp_path: Path) -> None:
    """Four connections with requests in progress and a cap of four: a fifth is answered 503 at once (no
    connection is idle, so none can make room); once they end, new connections are served again."""
    slow = CountingMock(ttft_ms=20_000, itl_ms=0)
    g = GatewayProcess(tmp_path, slow.url, {"connections": {"max_connections": 4},
                                            "tenants": [tenant_cfg("a", limit=8)]})
    busy: list[socket.socket] = []
    try:
        body = json.dumps({"model": "mock", "prompt": "x", "max_tokens": 1, "stream": True}).encode()
        try:
            for _ in range(4):
                s = connect(g)
                s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key('a')}\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                busy.append(s)
            # counted at the backend, so that no call of ours takes one of the four connections meanwhile
            wait_for(lambda: slow.counter.now == 4, 30, "four requests at the backend")
            with connect(g) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                got = read_response(s)
            assert_json_error(*got, 503, "too-many-connections")
        finally:
            for s in busy:
                s.close()
        wait_for(lambda: slow.counter.now == 0, 30, "the held requests to be cancelled")
        serves(g)
        assert g.state()["requests_in_progress"] == 0
    finally:
        g.stop()
        slow.stop()


def _metric(text: str, prefix: str) -> str:
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return line.split()[-1]
    raise AssertionError(f"no sample {prefix} in /metrics")


# ----------------------------------------------------------------- 4, 10. bodies and bytes that are not what they claim
def test_bytes_that_are_not_http_get_a_json_400(gw: GatewayProcess) -> None:
    for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n"):
        with connect(gw) as s:
            s.sendall(junk)
            assert_json_error(*read_response(s), 400, "bad-http")
    serves(gw)


@pytest.mark.parametrize("body", [
    b"[" * 20_000 + b"]" * 20_000,  # past Python's recursion limit (and under the admin API's 64 KB)
    b'{"model":"mock","prompt":' + b"[" * 100 + b"]" * 100 + b"}",  # under it, over the gateway's 64
])
def test_deeply_nested_json_is_a_400_with_a_log_line(gw: GatewayProcess, body: bytes) -> None:
    status, headers, raw = http("POST", gw.url + "/v1/completions", body, {"Authorization": f"Bearer {key('b')}"})
    doc = assert_json_error(status, headers, raw, 400, "bad-request")
    assert "deeper than 64" in doc["error"]["message"]
    status, headers, raw = http("PUT", gw.url + "/admin/limits", body, {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert_json_error(status, headers, raw, 400, "bad-request")
    wait_for(lambda: any(x["tenant"] == "b" and x["status"] == 400 for x in gw.request_log()), 10, "its log line")
    assert "Traceback" not in gw.stderr() and "RecursionError" not in gw.stderr()
    serves(gw, "b")


# ----------------------------------------------------------------- 3, 5. admin values
BAD_ENVELOPES = [
    b'{"requests_per_s": 1e-300}', b'{"requests_per_s": 1e-320}', b'{"requests_per_s": Infinity}',
    b'{"requests_per_s": Infinity, "request_burst": 5}', b'{"requests_per_s": NaN}', b'{"requests_per_s": 1e400}',
    b'{"requests_per_s": -1}', b'{"requests_per_s": 0}', b'{"requests_per_s": 2e6}',
    b'{"requests_per_s": 1, "request_burst": 0}', b'{"requests_per_s": 1, "request_burst": 1e12}',
    b'{"requests_per_s": 1, "request_burst": 2.5}', b'{"tokens_per_s": -Infinity}', b'{"tokens_per_s": 1e10}',
    b'{"tokens_per_s": 10, "token_burst": 10000000000}', b'{"requests_per_s": "fast"}', b'{"alert_below": 2}',
    b'{"requests_per_s": true}', b'{}', b'{"request_burst": 3}', b'{"requests_per_s": 1, "bogus": 1}',
]
BAD_LIMITS = [b'{"limit": -1}', b'{"limit": 1e7}', b'{"limit": 1.5}', b'{"limit": true}', b'{"limit": NaN}',
              b'{"limit": Infinity}', b'{"limit": 10000000}', b'{"limit": null}']


def test_every_admin_value_is_checked_before_it_is_taken(gw: GatewayProcess) -> None:
    before = gw.state()
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for raw in BAD_ENVELOPES:
        status, headers, body = http("PUT", gw.url + "/admin/tenants/a/envelopes/*", raw, auth)
        assert_json_error(status, headers, body, 400, "bad-request")
    for raw in BAD_LIMITS:
        status, headers, body = http("PUT", gw.url + "/admin/tenants/a/limit", raw, auth)
        assert_json_error(status, headers, body, 400, "bad-request")
    status, _, body = http("GET", gw.url + "/admin/state", None, auth)
    after = strict_json(body)
    assert status == 200 and after["version"] == before["version"]  # nothing was taken
    a0, a1 = before["tenants"]["a"], after["tenants"]["a"]
    assert a1["envelopes"] == [] and a1["limit"] == a0["limit"]
    # the range's ends are accepted, and the state stays strict JSON with them
    for raw in (b'{"requests_per_s": 1e-4}', b'{"requests_per_s": 1e6, "request_burst": 1000000}'):
        assert http("PUT", gw.url + "/admin/tenants/b/envelopes/edge", raw, auth)[0] == 200
    strict_json(http("GET", gw.url + "/admin/state", None, auth)[2])
    assert http("DELETE", gw.url + "/admin/tenants/b/envelopes/edge", None, auth)[0] == 200
    serves(gw)


# ----------------------------------------------------------------- 6. token envelopes charge what was used
def test_token_envelope_is_settled_with_the_real_usage(tmp_path: Path) -> None:
    """Chat requests without max_tokens, which the backend answers up to the rest of its context: each is
    charged that context up front (the emulator's /v1/models tells it; default_output_tokens would stand in
    if it did not) and then what it really used, so the envelope's budget follows the usage."""
    emu = start_emulator("--output-median", "40", "--output-sigma", "0.3")
    env = {"target": "*", "tokens_per_s": 2, "token_burst": 600}
    g = GatewayProcess(tmp_path, emu.url, {"default_output_tokens": 256,
                                           "tenants": [tenant_cfg("t", limit=4, envelopes=[env])]})
    try:
        model = json.loads(http("GET", emu.url + "/v1/models")[2])["data"][0]["id"]
        req = {"model": model, "messages": [{"role": "user", "content": "hello there"}]}
        headers = {"Authorization": f"Bearer {key('t')}"}
        status, _, body = http("POST", g.url + "/v1/chat/completions", req, headers, timeout=60)
        assert status == 200, body[:300]
        usage = json.loads(body)["usage"]
        used = usage["prompt_tokens"] + usage["completion_tokens"]
        t_done = time.monotonic()
        # settled: the bucket lacks what the request really used (plus the refill since), not the estimate
        remaining = wait_for(lambda: _tokens_left(g, used, t_done), 10, "the settled budget")
        assert abs(remaining - (600 - used)) <= 2 * (time.monotonic() - t_done) + 3, (remaining, used)
        # and the budget holds over many requests: what the admitted ones used stays within the envelope
        t0, spent, passed = time.monotonic(), used, 1
        for _ in range(20):
            status, _, body = http("POST", g.url + "/v1/chat/completions", req, headers, timeout=60)
            if status == 200:
                u = json.loads(body)["usage"]
                spent += u["prompt_tokens"] + u["completion_tokens"]
                passed += 1
            else:
                assert status == 429 and json.loads(body)["reason"] == "envelope-empty"
        elapsed = time.monotonic() - t0
        assert 1 <= passed < 21
        assert spent <= 600 + 2 * elapsed + 256 + 64, (spent, passed, elapsed)  # burst + refill + one estimate
    finally:
        g.stop()
        emu.stop()


def _tokens_left(g: GatewayProcess, used: int, since: float) -> float | None:
    env = g.state()["tenants"]["t"]["envelopes"][0]
    left = env["tokens"]["remaining"]
    # before the settle the bucket shows the estimate (prompt + 256); after it, close to 600 - used
    return left if abs(left - (600 - used)) <= 2 * (time.monotonic() - since) + 3 else None


# ----------------------------------------------------------------- 7, 8. who may read /metrics; anonymous log lines
def test_metrics_behind_a_token(mock: CountingMock, tmp_path: Path) -> None:
    os.environ["ADMIT_TEST_METRICS_TOKEN"] = "metrics-token-0123456789"
    try:
        g = GatewayProcess(tmp_path, mock.url, {"metrics": {"token_env": "ADMIT_TEST_METRICS_TOKEN"},
                                                "tenants": [tenant_cfg("a")]})
    finally:
        del os.environ["ADMIT_TEST_METRICS_TOKEN"]
    try:
        status, headers, body = http("GET", g.url + "/metrics")
        assert_json_error(status, headers, body, 401, "unauthorized")
        assert b"admit_gateway" not in body
        for token in ("metrics-token-0123456789", ADMIN_TOKEN):
            status, _, body = http("GET", g.url + "/metrics", None, {"Authorization": f"Bearer {token}"})
            assert status == 200 and b'admit_gateway_limit{tenant="a"}' in body
    finally:
        g.stop()


def test_anonymous_requests_cannot_grow_the_log_without_bound(mock: CountingMock, tmp_path: Path) -> None:
    g = GatewayProcess(tmp_path, mock.url, {"unauthenticated_log_per_s": 5, "tenants": [tenant_cfg("a")]})
    try:
        t0 = time.monotonic()
        n = 300
        c = hc.HTTPConnection(*addr(g), timeout=30)
        for i in range(n):
            path = "/v1/completions" if i % 2 else "/nothing/" + "x" * 190
            c.request("POST" if i % 2 else "GET", path, body=b"{}" if i % 2 else None)
            r = c.getresponse()
            r.read()
            assert r.status in (401, 404)
        c.close()
        elapsed = time.monotonic() - t0
        serves(g)
        lines = [x for x in g.request_log() if x["tenant"] is None]
        suppressed = float(_metric(g.metrics(), "admit_gateway_request_log_suppressed_total"))
        assert len(lines) + suppressed == n  # every request is either a line or counted
        assert len(lines) <= 50 + 5 * elapsed + 1, (len(lines), elapsed)  # burst 10x the rate, plus the rate
        assert sum(x.get("suppressed_before", 0) for x in lines) <= suppressed
    finally:
        g.stop()


# ----------------------------------------------------------------- 12. run-time state survives a restart
def test_limits_and_envelopes_set_at_run_time_survive_a_crash(mock: CountingMock, tmp_path: Path) -> None:
    cfg = {"state_file": str(tmp_path / "state.json"), "tenants": [tenant_cfg("a", limit=2), tenant_cfg("b")]}
    g = GatewayProcess(tmp_path, mock.url, cfg)
    try:
        assert g.admin("PUT", "/admin/limits", {"limits": {"a": 7, "b": 1}})[0] == 200
        assert g.admin("PUT", "/admin/tenants/b/envelopes/*", {"requests_per_s": 3, "request_burst": 9})[0] == 200
        version = g.state()["version"]
        versions = {t: st_["version"] for t, st_ in g.state()["tenants"].items()}
        assert versions == {"a": 1, "b": 2}  # b's limit, then its envelope
        g.proc.send_signal(signal.SIGKILL)  # a crash: no shutdown code runs
        g.proc.wait(10)
    finally:
        g.stop()
    g2 = GatewayProcess(tmp_path, mock.url, cfg)
    try:
        st_ = g2.state()
        assert st_["version"] == version
        assert {t: x["version"] for t, x in st_["tenants"].items()} == versions  # each tenant's sequence goes on
        assert g2.admin("PUT", "/admin/tenants/a/limit", {"limit": 6})[1]["tenants"]["a"]["version"] == 2
        assert st_["tenants"]["a"]["limit"] == 7 and st_["tenants"]["b"]["limit"] == 1
        envs = st_["tenants"]["b"]["envelopes"]
        assert [(e["target"], e["config"]["requests_per_s"], e["config"]["request_burst"]) for e in envs] == [
            ("*", 3, 9)]
        serves(g2)
    finally:
        g2.stop()
    # a state file that is not one stops start-up with an error naming it, and is left as it was
    (tmp_path / "state.json").write_text('{"format": 1, "limits": {"a": -3}}')
    bad = GatewayProcess(tmp_path, mock.url, cfg, wait=False)
    try:
        assert bad.proc.wait(60) != 0
        assert "state file" in bad.stderr() and "limits.a" in bad.stderr()
        assert (tmp_path / "state.json").read_text() == '{"format": 1, "limits": {"a": -3}}'
    finally:
        bad.stop()


# ----------------------------------------------------------------- the raw-HTTP fuzz
FUZZ_EXAMPLES = int(os.environ.get("ADMIT_FUZZ_EXAMPLES", "1500"))  # a longer run: docs/BENCHMARKS.md
token = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)
any_bytes = st.binary(max_size=40)
header_name = st.one_of(st.sampled_from([b"Transfer-Encoding", b"Authorization", b"Host", b"Connection", b"Expect",
                                         b"Content-Type", b"x-admit-step-id", b"Upgrade"]),
                        token.map(str.encode), any_bytes)
header_value = st.one_of(st.sampled_from([b"0", b"-1", b"99999999999999999999", b"chunked", b"gzip, chunked",
                                          b"close", b"keep-alive", b"upgrade", b"websocket", b"100-continue",
                                          b"Bearer " + key("a").encode(), b"Bearer nope"]),
                         st.integers(0, 10**6).map(lambda n: str(n).encode()), any_bytes)


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """One request of random parts. Its declared length never exceeds the body it carries (or a chunked body
    is terminated), so the gateway has the whole request and each case is answered at once; the deadlines
    are tested on their own above."""
    method = draw(st.one_of(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"CONNECT"]),
                            token.map(str.encode)))
    path = draw(st.one_of(st.sampled_from([b"/v1/completions", b"/v1/chat/completions", b"/health", b"/metrics",
                                           b"/admin/state", b"/v1/models", b"*", b"/%zz", b"/a?b=c#d"]),
                          any_bytes))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 extra", b"", b"http/1.1"]))
    headers = draw(st.lists(st.tuples(header_name, header_value), max_size=6))
    body = draw(st.one_of(st.just(b""), any_bytes, st.sampled_from([
        b'{"model":"mock","prompt":"x","max_tokens":1}', b"[" * 200 + b"]" * 200, b"zz\r\n"])))
    framing = draw(st.sampled_from(["length", "short-length", "two-lengths", "chunked", "chunked+length", "none"]))
    if framing == "length":
        headers.append((b"Content-Length", str(len(body)).encode()))
    elif framing == "short-length":
        headers.append((b"Content-Length", str(len(body) // 2).encode()))
    elif framing == "two-lengths":
        headers += [(b"Content-Length", str(len(body)).encode()), (b"Content-Length", b"0")]
    elif framing.startswith("chunked"):
        headers.append((b"Transfer-Encoding", b"chunked"))
        body = (b"%x\r\n" % len(body) + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
        if framing == "chunked+length":
            headers.append((b"Content-Length", b"3"))
    head = method + b" " + path + b" " + version + b"\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in headers)
    # Connection: close last, so that every answer ends with a close
    return head + b"Connection: close\r\n\r\n" + body


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=raw_requests())
def test_raw_http_fuzz_gets_json_answers_only(fuzzed: GatewayProcess, raw: bytes) -> None:
    with connect(fuzzed, timeout=30) as s:
        s.sendall(raw)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:  # closed with unread bytes of ours in its buffer: the answer came first
            pass
    assert data, f"no answer to {raw[:200]!r}"
    status_line, _, rest = data.partition(b"\r\n")
    status = int(status_line.split()[1])
    if status in (200, 100):
        return  # /health, /metrics, or a valid request (the fuzzed tenant has limit 0: it would be a 429)
    head, _, body = rest.partition(b"\r\n\r\n")
    assert 400 <= status < 500 or status == 503, (status, raw[:200], data[:300])
    if body:  # a HEAD answer has none
        doc = json.loads(body)
        assert isinstance(doc["reason"], str) and doc["error"]["message"], doc


@pytest.fixture(scope="module")
def fuzzed(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # a request whose fuzzed headers still leave it incomplete (e.g. a random "Transfer-Encoding") is answered
    # 408 at these deadlines rather than hanging the case
    cfg = {"connections": {"head_timeout_s": 2, "body_timeout_s": 2},
           "tenants": [tenant_cfg("a", limit=0, max_queue=0)]}
    g = GatewayProcess(tmp_path_factory.mktemp("fuzz"), mock.url, cfg)
    yield g
    g.stop()


def test_after_the_fuzz_the_gateway_serves_with_nothing_left_behind(fuzzed: GatewayProcess) -> None:
    st_ = fuzzed.state()
    assert st_["in_flight"] == 0 and st_["requests_in_progress"] == 0
    assert "Traceback" not in fuzzed.stderr()
    assert fuzzed.admin("PUT", "/admin/limits", {"limits": {"a": 1}})[0] == 200
    serves(fuzzed)


def test_many_clients_at_once_through_the_guards(gw: GatewayProcess) -> None:
    """The guards cost nothing to honest traffic: 8 threads x 25 keep-alive requests, all answered 200."""
    errors: list[str] = []

    def client() -> None:
        c = hc.HTTPConnection(*addr(gw), timeout=30)
        body = json.dumps({"model": "mock", "prompt": "x", "max_tokens": 2})
        for _ in range(25):
            c.request("POST", "/v1/completions", body=body, headers={"Authorization": f"Bearer {key('a')}"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                errors.append(str(r.status))
        c.close()

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []

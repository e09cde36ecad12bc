"""Fuzzing the running gateway with hypothesis: thousands of bad requests get only 4xx JSON errors.

Random JSON and random bytes as completion bodies (the output-limit fields that decide a token charge
included), random paths and methods, random credentials and step ids, and admin paths with percent-escapes,
control characters and Unicode in the tenant and envelope names. The fuzzed tenant has limit 0 and no
queue, so a body that happens to be valid is deferred (429) rather than sent to the backend: the target
here is the gateway's own input handling. Seeded (``derandomize``): the same cases every run, in process and
on a real redis-server. Afterwards the gateway holds nothing, and its process log has only whole lines: no
name got a raw newline into it.
"""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from gateway_helpers import ADMIN_TOKEN, CountingMock, GatewayProcess, key, tenant_cfg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_helpers import RedisServer

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
FUZZ = settings(max_examples=500, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module", params=["in-process", "redis"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    m = CountingMock(itl_ms=0)
    rs = RedisServer(tmp_path_factory.mktemp("redis")) if request.param == "redis" else None
    cfg: dict[str, Any] = {"max_body_bytes": 2048, "tenants": [tenant_cfg("fuzz", limit=0, max_queue=0)]}
    if rs is not None:
        cfg["redis"] = {"url": rs.url}
    g = GatewayProcess(tmp_path_factory.mktemp("gw"), m.url, cfg)
    yield g
    g.stop()
    m.stop()
    if rs is not None:
        rs.stop()


class Conn:
    """One keep-alive connection, reopened when the server closed it."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.addr = (host, int(port))
        self.c = http.client.HTTPConnection(*self.addr, timeout=10)

    def send(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, dict, bytes]:
        for attempt in (0, 1):
            try:
                self.c.request(method, path, body=body, headers=headers)
                r = self.c.getresponse()
                return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
            except (http.client.HTTPException, ConnectionError):
                self.c.close()
                self.c = http.client.HTTPConnection(*self.addr, timeout=10)
                if attempt:
                    raise
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def conn(gw: GatewayProcess) -> Conn:
    return Conn(gw.url)


def assert_json_4xx(status: int, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert 400 <= status < 500, (status, body[:200])
    assert headers.get("content-type") == "application/json", headers
    doc = json.loads(body)
    assert isinstance(doc["error"]["message"], str) and doc["reason"] == headers["x-admit-reason"]
    return doc


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=8,
)
# bodies that look like requests: the real keys with values of any type
request_like = st.fixed_dictionaries({}, optional={
    "model": json_values, "prompt": json_values, "messages": json_values, "max_tokens": json_values,
    "stream": json_values, "stream_options": json_values, "max_completion_tokens": json_values,
    "n": json_values, "best_of": json_values,
})
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@FUZZ
@given(body=st.one_of(json_values, request_like, st.binary(max_size=200),
                     st.integers(2000, 2100).map(lambda n: b"{" + b" " * n + b"}")),
       path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_random_bodies(conn: Conn, body: Any, path: str) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, headers, raw = conn.send("POST", path, data, {"Authorization": f"Bearer {key('fuzz')}",
                                                          "Content-Type": "application/json"})
    doc = assert_json_4xx(status, headers, raw)
    if status == 429:
        assert doc["reason"] == "queue-full" and headers["retry-after"].isdigit()


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
       path=st.one_of(st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/models", "/admin/state",
                                       "/admin/limits", "/admin/tenants/fuzz/limit", "/v2/x", "/"]),
                      st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30).map(
                          lambda s: "/" + s.replace("?", "").replace("#", ""))),
       auth=st.one_of(st.none(), header_text, header_text.map(lambda s: "Bearer " + s)),
       step=st.one_of(st.none(), header_text))
def test_random_paths_methods_and_headers(conn: Conn, method: str, path: str, auth: str | None,
                                         step: str | None) -> None:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    if step is not None:
        headers["x-admit-step-id"] = step
    body = b'{"model":"m","prompt":"p"}' if method in ("POST", "PUT", "PATCH") else None
    status, rh, raw = conn.send(method, path, body, headers)
    if path in ("/health", "/metrics") and method == "GET":
        assert status == 200
        return
    assert_json_4xx(status, rh, raw)


# a name as a client may spell it in a URL: any text, percent-escaped whole or in part, escapes of escapes included
name_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x2FF), min_size=1, max_size=12)
url_names = st.one_of(
    name_text.map(lambda t: quote(t, safe="")),
    name_text.map(lambda t: quote(quote(t, safe=""), safe="")),
    st.sampled_from(["%0A", "%250A", "x%0D%0Ay", "%2F", "a%2Fb", "%00", "%E2%80%A8", "*", "%2A", "..", "%25"]),
)


@FUZZ
@given(tenant=st.one_of(st.just("fuzz"), url_names), target=url_names,
       method=st.sampled_from(["GET", "PUT", "DELETE"]),
       body=st.one_of(st.just(b'{"requests_per_s": 5}'), st.binary(max_size=40)))
def test_admin_paths_with_any_names(conn: Conn, tenant: str, target: str, method: str, body: bytes) -> None:
    status, headers, raw = conn.send(method, f"/admin/tenants/{tenant}/envelopes/{target}",
                                     body if method == "PUT" else None,
                                     {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"})
    if status == 200:
        doc = json.loads(raw)
        assert all(e["target"].isprintable() and " " not in e["target"] for e in doc["envelopes"]), doc
        assert doc["tenant"] == "fuzz" and isinstance(doc["changed"], bool)
        return
    assert_json_4xx(status, headers, raw)


LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")


def test_fuzzing_left_no_state_behind_and_no_secret_in_logs(gw: GatewayProcess) -> None:
    st_ = gw.state()
    assert st_["in_flight"] == 0 and st_["requests_in_progress"] == 0
    text = gw.request_log_path.read_text() + gw.stderr()
    assert key("fuzz") not in text and ADMIN_TOKEN not in text
    assert "Traceback" not in gw.stderr()
    # whole lines only: a name that reached a log line raw could have started a line of its own
    torn = [line for line in gw.stderr().splitlines() if line and not LOG_LINE.match(line)]
    assert not torn, torn[:5]

"""Admin API (auth, limits, audit) and tenant identity modes; secrets never reach a log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_helpers import ADMIN_TOKEN, CountingMock, GatewayProcess, http, key, tenant_cfg, wait_for

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def gw(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = {"tenants": [tenant_cfg("a", limit=2), tenant_cfg("b", limit=3)]}
    g = GatewayProcess(tmp_path_factory.mktemp("gw"), mock.url, cfg)
    yield g
    g.stop()


def test_admin_needs_the_token(gw: GatewayProcess) -> None:
    for token in ("", "wrong", ADMIN_TOKEN[:-1], ADMIN_TOKEN + "x", key("a")):
        status, body = gw.admin("GET", "/admin/state", token=token)
        assert status == 401 and body["reason"] == "unauthorized"
    status, body = gw.admin("PUT", "/admin/limits", {"limits": {"a": 9}}, token="wrong")
    assert status == 401
    assert gw.state()["tenants"]["a"]["limit"] == 2  # the refused change did not happen


def test_batch_limits_are_atomic_versioned_and_audited(gw: GatewayProcess) -> None:
    v0 = gw.state()["version"]
    status, body = gw.admin("PUT", "/admin/limits", {"limits": {"a": 5, "b": -1}, "reason": "bad"})
    assert status == 400 and "'limit'" in body["error"]["message"]
    status, body = gw.admin("PUT", "/admin/limits", {"limits": {"a": 5, "nobody": 1}})
    assert status == 404 and "nobody" in body["error"]["message"]
    assert gw.state()["tenants"]["a"]["limit"] == 2 and gw.state()["version"] == v0  # nothing applied
    status, body = gw.admin("PUT", "/admin/limits", {"limits": {"a": 5, "b": 3}, "reason": "step 7"}, actor="loop")
    assert status == 200
    assert body["version"] == v0 + 1 and body["tenants"]["a"]["limit"] == 5 and body["tenants"]["b"]["limit"] == 3
    audit = gw.audit_log()
    assert len([x for x in audit if x["version"] == v0 + 1]) == 1  # b did not change: no line for it
    last = audit[-1]
    assert {k: last[k] for k in ("version", "actor", "what", "tenant", "old", "new", "reason")} == {
        "version": v0 + 1, "actor": "loop", "what": "limit", "tenant": "a", "old": 2, "new": 5, "reason": "step 7"}
    assert gw.admin("GET", "/admin/tenants/a")[1]["limit"] == 5
    assert 'admit_gateway_limit{tenant="a"} 5.0' in gw.metrics()


def test_admin_errors_are_json(gw: GatewayProcess) -> None:
    assert gw.admin("GET", "/admin/nothing")[0] == 404
    assert gw.admin("PUT", "/admin/tenants/a/limit", {"limit": "many"})[0] == 400
    status, _, body = http("PUT", gw.url + "/admin/limits", b"{not json", {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 400 and b"not valid JSON" in body
    status, body = gw.admin("PUT", "/admin/tenants/a/borrow", {"borrow": 2})
    assert status == 400 and "capacity" in body["error"]["message"]


def test_no_secret_in_any_log(gw: GatewayProcess) -> None:
    http("POST", gw.url + "/v1/completions", {"model": "mock", "prompt": "x"}, {"Authorization": f"Bearer {key('a')}"})
    gw.admin("PUT", "/admin/tenants/a/limit", {"limit": 4, "reason": "x"})
    gw.admin("GET", "/admin/state", token="guess-" + ADMIN_TOKEN)
    text = gw.request_log_path.read_text() + gw.audit_log_path.read_text() + gw.stderr()
    for secret in (ADMIN_TOKEN, key("a"), key("b")):
        assert secret not in text


def test_trusted_header_mode_and_disabled_admin(mock: CountingMock, tmp_path: Path) -> None:
    cfg = {"auth": {"mode": "trusted_header", "header": "x-tenant"}, "admin": {},
           "tenants": [{"name": "t1", "limit": 1}]}
    g = GatewayProcess(tmp_path, mock.url, cfg)
    try:
        body = {"model": "mock", "prompt": "x", "max_tokens": 2}
        assert http("POST", g.url + "/v1/completions", body, {"x-tenant": "t1"})[0] == 200
        status, headers, _ = http("POST", g.url + "/v1/completions", body, {"x-tenant": "t2"})
        assert status == 401 and headers["x-admit-reason"] == "unknown-tenant"
        assert g.admin("GET", "/admin/state")[0] == 403  # no token configured: the admin API is off
        assert wait_for(g.request_log, 10, "the request-log line")[0]["tenant"] == "t1"
    finally:
        g.stop()

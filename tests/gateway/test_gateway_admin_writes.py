"""Admin writes that are never lost: compare-and-set in Redis across two real gateway replicas (the last write
wins everywhere, one version sequence for all replicas), a PUT that changes nothing says so and writes no
version, a write Redis cannot store is refused; values read back from Redis are checked like admin input;
admin paths are percent-decoded once and envelope targets checked after decoding."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
from admit.gateway.config import ConfigError, EnvelopeConfig
from admit.gateway.state import SavedState, load_state, save_state
from gateway_helpers import ADMIN_TOKEN, CountingMock, GatewayProcess, http, key, tenant_cfg, wait_for
from pydantic import ValidationError
from redis_helpers import RedisServer

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    m = CountingMock(itl_ms=25)
    yield m
    m.stop()


def redis_cfg(rs: RedisServer, **kw: Any) -> dict[str, Any]:
    return {"url": rs.url, "failure_mode": "closed", "lease_ttl_s": 30, "poll_s": 0.05, "timeout_s": 1, **kw}


def stored(rs: RedisServer, key_: str, field: str) -> str | None:
    with redis.Redis.from_url(rs.url, decode_responses=True) as r:
        return r.hget(key_, field)  # type: ignore[return-value]


def put_limit(g: GatewayProcess, tenant: str, limit: int, reason: str = "") -> dict[str, Any]:
    status, body = g.admin("PUT", f"/admin/tenants/{tenant}/limit", {"limit": limit, "reason": reason})
    assert status == 200, body
    return body


# ----------------------------------------------------------------- the last write wins on every replica
def test_interleaved_writes_on_two_replicas_end_at_the_last_one(
    tmp_path: Path, mock: CountingMock, rs: RedisServer
) -> None:
    """Ten rounds: replica B sets alpha to 20, replica A sets it to 5 right after B answered. Every round ends
    at 5 on both replicas and in Redis; the audit lines of both replicas form one chain (each version once,
    one tenant version sequence, each old value the previous new one). Envelope changes too."""
    cfg = {"redis": redis_cfg(rs), "tenants": [tenant_cfg("alpha", limit=5), tenant_cfg("beta", limit=1)]}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = GatewayProcess(tmp_path / "a", mock.url, cfg, wait=False)
    b = GatewayProcess(tmp_path / "b", mock.url, cfg, wait=False)
    gs = (a, b)

    def limits() -> list[Any]:
        return [g.state()["tenants"]["alpha"]["limit"] for g in gs] + [stored(rs, "admit:limits", "alpha")]

    def rps() -> list[Any]:
        return [[e["config"]["requests_per_s"] for e in g.state()["tenants"]["beta"]["envelopes"]] for g in gs]

    try:
        a.ready()
        b.ready()
        answers = []
        for i in range(10):
            wait_for(lambda: limits() == [5, 5, "5"], 10, f"alpha at 5 everywhere before round {i}")
            answers.append(put_limit(b, "alpha", 20, f"round {i} on B"))
            answers.append(put_limit(a, "alpha", 5, f"round {i} on A"))
        wait_for(lambda: limits() == [5, 5, "5"], 10, "alpha at 5 everywhere after the last round")
        assert [x["changed"] for x in answers] == [True] * 20
        envelope = {"target": "*", "request_burst": 100}
        for i in range(3):
            if i:
                wait_for(lambda: rps() == [[5], [5]], 10, f"beta's envelope at 5/s before round {i}")
            for g, rate in ((b, 20), (a, 5)):
                status, body = g.admin("PUT", "/admin/tenants/beta/envelopes/*", {**envelope, "requests_per_s": rate})
                assert status == 200 and body["changed"] is True, body
        wait_for(lambda: rps() == [[5], [5]], 10, "beta's envelope at 5/s everywhere")

        lines = sorted(a.audit_log() + b.audit_log(), key=lambda x: x["version"])
        assert [x["version"] for x in lines] == list(range(1, 27))  # one sequence: every version once
        alpha = [x for x in lines if x["tenant"] == "alpha"]
        beta = [x for x in lines if x["tenant"] == "beta"]
        assert [x["tenant_version"] for x in alpha] == list(range(1, 21))
        assert [x["tenant_version"] for x in beta] == list(range(1, 7))
        assert [x["new"] for x in alpha] == [20, 5] * 10
        for prev, cur in itertools.pairwise(alpha):
            assert cur["old"] == prev["new"]  # each write saw what Redis held, not a replica's copy
        assert all(x["new"] == 5 for x in a.audit_log() if x["tenant"] == "alpha")
        assert all(x["new"] == 20 for x in b.audit_log() if x["tenant"] == "alpha")
        assert [x["new"]["requests_per_s"] for x in beta] == [20, 5] * 3
        assert [x["old"]["requests_per_s"] if x["old"] else None for x in beta] == [None, 20, 5, 20, 5, 20]
        assert [x["version"] for x in answers] == [x["version"] for x in alpha]  # the answers say it too

        def same_versions() -> list[Any]:
            got = [(g.state()["version"], g.state()["tenants"]["alpha"]["version"],
                    g.state()["tenants"]["beta"]["version"]) for g in gs]
            return got if got[0] == got[1] else []

        assert wait_for(same_versions, 10, "both replicas at the same versions") == [(26, 20, 6)] * 2
        with redis.Redis.from_url(rs.url, decode_responses=True) as r:
            assert r.get("admit:version") == "26"
            assert r.hgetall("admit:tenant_versions") == {"alpha": "20", "beta": "6"}
    finally:
        a.stop()
        b.stop()


# ----------------------------------------------------------------- a PUT that changes nothing
@pytest.mark.parametrize("mode", ["in-process", "redis"])
def test_a_put_that_changes_nothing_says_so_and_writes_no_version(
    mode: str, tmp_path: Path, mock: CountingMock, request: pytest.FixtureRequest
) -> None:
    tenants = [tenant_cfg("a", limit=2), tenant_cfg("b", limit=3)]
    if mode == "redis":
        cfg: dict[str, Any] = {"redis": redis_cfg(request.getfixturevalue("rs")), "tenants": tenants}
    else:
        cfg = {"capacity": 8, "tenants": tenants}
    g = GatewayProcess(tmp_path, mock.url, cfg)
    env = {"target": "*", "requests_per_s": 2, "request_burst": 4}
    try:
        assert g.state()["version"] == 0
        same = [
            g.admin("PUT", "/admin/tenants/a/limit", {"limit": 2, "reason": "same"}),
            g.admin("PUT", "/admin/limits", {"limits": {"a": 2, "b": 3}}),
        ]
        if mode == "in-process":
            same.append(g.admin("PUT", "/admin/tenants/a/borrow", {"borrow": 0}))
        for status, body in same:
            assert status == 200 and body["changed"] is False and body["version"] == 0, body
        status, body = g.admin("PUT", "/admin/tenants/a/envelopes/*", env)
        assert status == 200 and body["changed"] is True and body["version"] == 1
        assert body["tenant_version"] == 1
        for _ in range(2):  # the same config again: unchanged, however often
            status, body = g.admin("PUT", "/admin/tenants/a/envelopes/*", env)
            assert status == 200 and body["changed"] is False and body["version"] == 1, body
        status, body = g.admin("PUT", "/admin/limits", {"limits": {"a": 4, "b": 3}, "reason": "only a"})
        assert status == 200 and body["changed"] is True and body["version"] == 2
        st = g.state()
        assert st["version"] == 2
        assert (st["tenants"]["a"]["version"], st["tenants"]["b"]["version"]) == (2, 0)
        audit = g.audit_log()
        assert [(x["version"], x["tenant_version"], x["what"], x["tenant"]) for x in audit] == [
            (1, 1, "envelope", "a"), (2, 2, "limit", "a")]
        assert audit[1]["old"] == 2 and audit[1]["new"] == 4 and audit[1]["reason"] == "only a"
        status, body = g.admin("DELETE", "/admin/tenants/a/envelopes/*")
        assert status == 200 and body["changed"] is True and body["version"] == 3
        status, body = g.admin("DELETE", "/admin/tenants/a/envelopes/*")  # nothing left to remove
        assert status == 404 and body["reason"] == "not-found"
        assert g.state()["version"] == 3 and len(g.audit_log()) == 3
    finally:
        g.stop()


# ----------------------------------------------------------------- Redis unreachable during a write
def test_an_admin_write_redis_cannot_store_is_refused_and_applies_nothing(
    tmp_path: Path, mock: CountingMock, rs: RedisServer
) -> None:
    cfg = {"redis": redis_cfg(rs), "tenants": [tenant_cfg("a", limit=2)]}
    g = GatewayProcess(tmp_path, mock.url, cfg)
    try:
        rs.kill()
        wait_for(lambda: g.state()["redis"]["up"] is False, 20, "the outage seen")
        for path, body in (("/admin/tenants/a/limit", {"limit": 7}), ("/admin/limits", {"limits": {"a": 7}}),
                           ("/admin/tenants/a/envelopes/*", {"requests_per_s": 1})):
            status, answer = g.admin("PUT", path, body)
            assert status == 503 and answer["reason"] == "admission-unavailable", answer
            assert "nothing was applied" in answer["error"]["message"]
        st = g.state()
        assert st["tenants"]["a"]["limit"] == 2 and st["tenants"]["a"]["envelopes"] == [] and st["version"] == 0
        assert g.audit_log() == []
        rs.start()
        wait_for(lambda: g.state()["redis"]["up"], 20, "recovery")
        assert put_limit(g, "a", 7)["changed"] is True
        assert stored(rs, "admit:limits", "a") == "7"
    finally:
        g.stop()


# ----------------------------------------------------------------- versions in one replica, against Redis
def test_a_read_older_than_a_write_never_undoes_it_and_versions_survive_a_flushed_server(rs: RedisServer) -> None:
    """A READ answered before an admin write lands after it (its reply was on its way): the replica keeps the
    written limit. A server that lost its data continues the version sequences from the replica's."""
    from admit.gateway.config import RedisConfig, TenantConfig
    from admit.gateway.redis.admission import RedisAdmission

    tenants = [TenantConfig(name="a", limit=2), TenantConfig(name="b", limit=3)]
    cfg = RedisConfig(url=rs.url, poll_s=30, lease_ttl_s=300, timeout_s=1)  # no refresh of its own meanwhile

    async def run() -> None:
        adm = RedisAdmission(tenants, cfg, "r1")
        await adm.start()
        try:
            keys = [*adm._zkeys, adm._limits_key, adm.versions_key, adm.version_key]
            stale = await adm._read(keys=keys, args=adm.names)
            written = await adm.write_limits([(0, 9), (1, 3)])
            assert written.version == 1 and [(c.tenant, c.old, c.new, c.tenant_version) for c in written.changes] == [
                (0, 2, 9, 1)]
            adm._apply_read(range(2), stale)  # the old read, applied late
            assert (adm.limit(0), adm.versions, adm.version) == (9, [1, 0], 1)
            adm._apply_read(range(2), await adm._read(keys=keys, args=adm.names))  # a fresh one changes nothing
            assert (adm.limit(0), adm.versions) == (9, [1, 0])
            again = await adm.write_limits([(0, 9)])
            assert again.version == 1 and again.changes == []
            with redis.Redis.from_url(rs.url) as r:
                r.flushall()  # the server lost everything; this replica still knows versions 1 and [1, 0]
            adm._apply_read(range(2), await adm._read(keys=keys, args=adm.names))
            assert (adm.limit(0), adm.versions, adm.version) == (9, [1, 0], 1)  # nothing to take, nothing lost
            written = await adm.write_limits([(0, 4)])
            assert written.version == 2 and written.changes[0].old is None and written.changes[0].tenant_version == 2
            with redis.Redis.from_url(rs.url, decode_responses=True) as r:
                assert r.get("admit:version") == "2" and r.hget("admit:tenant_versions", "a") == "2"
        finally:
            await adm.close()

    asyncio.run(run())


# ----------------------------------------------------------------- values read back from Redis
async def _burst(url: str, n: int) -> list[tuple[int, str | None]]:
    async def one(s: aiohttp.ClientSession) -> tuple[int, str | None]:
        body = {"model": "mock", "prompt": "x", "max_tokens": 8, "stream": True}
        async with s.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key('a')}"}) as r:
            async for _ in r.content.iter_any():
                pass
            return r.status, r.headers.get("x-admit-reason")

    async with aiohttp.ClientSession() as s:
        return await asyncio.gather(*(one(s) for _ in range(n)))


BAD_LIMITS = ["nan", "1e400", "-3", "2.5", "abc"]


def test_bad_limits_in_redis_are_refused_counted_and_logged_once(
    tmp_path: Path, mock: CountingMock, rs: RedisServer
) -> None:
    """A limit written into Redis behind the gateway's back that is not an integer 0..LIMIT_MAX: the tenant
    keeps being admitted at its last good limit (counted at the backend), the refusal is counted (state and
    metrics) and logged once per value; an admin write replaces it."""
    cfg = {"redis": redis_cfg(rs), "tenants": [tenant_cfg("a", limit=3, max_queue=50, queue_timeout_s=15)]}
    g = GatewayProcess(tmp_path, mock.url, cfg)
    try:
        for bad in BAD_LIMITS:
            before = g.state()["redis"]["bad_values"]
            with redis.Redis.from_url(rs.url) as r:
                r.hset("admit:limits", "a", bad)
            wait_for(lambda n=before: g.state()["redis"]["bad_values"] >= n + 2, 10, f"{bad!r} read and refused")
            wait_for(lambda: mock.counter.now == 0, 10, "an idle backend")
            mock.counter.reset_max()
            assert asyncio.run(_burst(g.url, 7)) == [(200, None)] * 7, bad
            assert mock.counter.max == 3, bad  # the last good limit: not 0, not unlimited
            assert g.state()["tenants"]["a"]["limit"] == 3
        st = g.state()["redis"]
        assert st["bad_values_by_kind"]["limit"] == st["bad_values"] and st["up"] and st["script_errors"] == 0
        metric = 'admit_gateway_redis_bad_values_total{kind="limit"} '
        counted = [x for x in g.metrics().splitlines() if x.startswith(metric)]
        assert len(counted) == 1 and float(counted[0].rsplit(" ", 1)[1]) >= st["bad_values"]  # still being read
        log = g.stderr()
        for bad in BAD_LIMITS:
            lines = [x for x in log.splitlines() if "redis holds a bad limit" in x and repr(bad) in x]
            assert len(lines) == 1, (bad, lines)  # once per value, however often it was read
        # a bad version is refused alike, and an admin write replaces the bad values
        with redis.Redis.from_url(rs.url) as r:
            r.hset("admit:tenant_versions", "a", "1.5")
        wait_for(lambda: g.state()["redis"]["bad_values_by_kind"].get("version", 0) >= 1, 10, "the bad version")
        body = put_limit(g, "a", 2)
        assert body["changed"] is True and body["tenants"]["a"]["version"] == 1
        assert stored(rs, "admit:limits", "a") == "2" and stored(rs, "admit:tenant_versions", "a") == "1"
        wait_for(lambda: mock.counter.now == 0, 10, "an idle backend")
        mock.counter.reset_max()
        assert asyncio.run(_burst(g.url, 5)) == [(200, None)] * 5
        assert mock.counter.max == 2
    finally:
        g.stop()


# ----------------------------------------------------------------- admin paths and envelope targets
def test_admin_paths_are_decoded_once_and_targets_are_checked(tmp_path: Path, mock: CountingMock) -> None:
    g = GatewayProcess(tmp_path, mock.url, {"tenants": [tenant_cfg("a", limit=4)]})
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    env = {"requests_per_s": 0.001, "request_burst": 2}
    try:
        # %250A is "%0A" once decoded (not a newline); %0A and %09 are a newline and a tab: all refused
        for target in ("x%250Ay", "x%0Ay", "x%09y", "x%20y", "llama*", "%C3%A9"):
            status, _, raw = http("PUT", f"{g.url}/admin/tenants/a/envelopes/{target}", env, auth)
            body = json.loads(raw)
            assert status == 400 and body["reason"] == "bad-request", (target, body)
            assert "letters, digits" in body["error"]["message"], body
        assert g.state()["tenants"]["a"]["envelopes"] == [] and g.audit_log() == []
        log = g.stderr()
        assert "x\ny" not in log and "x\ty" not in log
        # a model name with "/" as one escaped segment, or as the rest of the path: the same target
        status, _, raw = http("PUT", f"{g.url}/admin/tenants/a/envelopes/meta-llama%2FLlama-3-8B", env, auth)
        assert status == 200 and json.loads(raw)["changed"] is True
        status, _, raw = http("PUT", f"{g.url}/admin/tenants/a/envelopes/meta-llama/Llama-3-8B", env, auth)
        assert status == 200 and json.loads(raw)["changed"] is False
        assert [e["target"] for e in g.state()["tenants"]["a"]["envelopes"]] == ["meta-llama/Llama-3-8B"]
        req = {"model": "meta-llama/Llama-3-8B", "prompt": "x", "max_tokens": 1}
        answers = [http("POST", g.url + "/v1/completions", req, {"Authorization": f"Bearer {key('a')}"})
                   for _ in range(3)]
        assert [(s, h.get("x-admit-reason")) for s, h, _ in answers] == [(200, None)] * 2 + [(429, "envelope-empty")]
        status, _, _ = http("DELETE", f"{g.url}/admin/tenants/a/envelopes/meta-llama/Llama-3-8B", None, auth)
        assert status == 200 and g.state()["tenants"]["a"]["envelopes"] == []
    finally:
        g.stop()


def test_envelope_targets_are_checked_wherever_they_come_from() -> None:
    for ok in ("*", "mock", "meta-llama/Llama-3-8B", "ft:gpt-3.5-turbo:org:custom:id", "llama3.1:8b",
               "/models/Qwen2.5-7B-Instruct", "model@v1+fp8"):
        assert EnvelopeConfig(target=ok, requests_per_s=1).target == ok
    for bad in ("x\ny", "x\ty", "x y", "x%0Ay", "llama*", "é", "a\x7f", ""):
        with pytest.raises(ValidationError) as exc:
            EnvelopeConfig(target=bad, requests_per_s=1)
        assert "target" in str(exc.value), bad


# ----------------------------------------------------------------- the state file keeps tenant versions
def test_the_state_file_keeps_tenant_versions_and_old_files_still_load(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, SavedState(version=7, limits={"a": 3}, tenant_versions={"a": 5, "b": 2}))
    got = load_state(path)
    assert got is not None and got.version == 7 and got.tenant_versions == {"a": 5, "b": 2}
    path.write_text('{"format": 1, "version": 4, "limits": {"a": 3}}')  # written before tenant versions
    old = load_state(path)
    assert old is not None and old.version == 4 and old.tenant_versions == {}
    path.write_text('{"format": 1, "tenant_versions": {"a": -1}}')
    with pytest.raises(ConfigError, match="tenant_versions.a"):
        load_state(path)

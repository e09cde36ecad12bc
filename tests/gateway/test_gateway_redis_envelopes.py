"""Rate envelopes shared by two real gateway replicas on a real redis-server, in front of the mock backend:
together they admit one envelope (counted), a change made through one replica's admin API binds the other
(and a replica started later), and a Redis killed mid-run gives the documented fail-closed / fail-open
answers, leaks no lease and leaves Redis's buckets the truth once it is back."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
from gateway_helpers import CountingMock, GatewayProcess, key, tenant_cfg, wait_for
from redis_helpers import RedisServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]

RATE = 0.05  # requests per second: one unit refills every 20 s, so a test sees the burst and little else


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    m = CountingMock(itl_ms=25)
    yield m
    m.stop()


def config(rs: RedisServer, mode: str, burst: int = 6) -> dict[str, Any]:
    return {
        "redis": {"url": rs.url, "failure_mode": mode, "lease_ttl_s": 30, "poll_s": 0.05, "timeout_s": 1},
        "tenants": [
            tenant_cfg(
                "req",
                limit=8,
                max_queue=50,
                queue_timeout_s=60,
                envelopes=[{"target": "*", "requests_per_s": RATE, "request_burst": burst}],
            ),
            tenant_cfg(
                "tok",
                limit=8,
                max_queue=50,
                queue_timeout_s=60,
                envelopes=[{"target": "mock", "tokens_per_s": 1, "token_burst": 200}],
            ),
            tenant_cfg(
                "one", limit=1, max_queue=0, envelopes=[{"target": "*", "requests_per_s": RATE, "request_burst": 3}]
            ),
        ],
    }


def replicas(tmp: Path, mock: CountingMock, cfg: dict[str, Any], n: int = 2) -> list[GatewayProcess]:
    out = []
    for i in range(n):
        (tmp / f"g{i}").mkdir()
        out.append(GatewayProcess(tmp / f"g{i}", mock.url, cfg))
    return out


Answer = tuple[int, str | None]


async def one(
    s: aiohttp.ClientSession, url: str, tenant: str, tokens: int = 2, model: str = "mock", stream: bool = False
) -> Answer:
    body = {"model": model, "prompt": "x", "max_tokens": tokens, "stream": stream}
    async with s.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key(tenant)}"}) as r:
        await r.read()
        return r.status, r.headers.get("x-admit-reason")


async def spread(urls: list[str], n: int, tenant: str, **kw: Any) -> list[Answer]:
    """``n`` requests at once, alternating between the replicas (request i goes to urls[i % len])."""
    async with aiohttp.ClientSession() as s:
        return await asyncio.gather(*(one(s, urls[i % len(urls)], tenant, **kw) for i in range(n)))


def envelope(g: GatewayProcess, tenant: str) -> dict[str, Any]:
    envs = g.state()["tenants"][tenant]["envelopes"]
    assert len(envs) == 1, envs
    return envs[0]


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"admit_gateway_{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def leases(rs: RedisServer, tenants: tuple[str, ...] = ("req", "tok", "one")) -> int:
    with redis.Redis.from_url(rs.url) as r:
        return sum(int(r.zcard(f"admit:leases:{t}")) for t in tenants)


def stop(gs: list[GatewayProcess]) -> None:
    for g in gs:
        g.stop()


def test_two_replicas_admit_one_envelope_together(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    gs = replicas(tmp_path, mock, config(rs, "closed"))
    urls = [g.url for g in gs]
    try:
        t0 = time.monotonic()
        # one request through each replica first, so both charge the shared bucket however the machine's load
        # schedules the burst below (under load one replica's twelve could reach Redis before the other's)
        req = [asyncio.run(spread([u], 1, "req"))[0] for u in urls]
        assert req == [(200, None)] * 2
        req += asyncio.run(spread(urls, 22, "req"))
        # 40-token requests (+1 for the prompt) against 200 tokens: 4 fit; another model is not this envelope's
        tok = asyncio.run(spread(urls, 12, "tok", tokens=40))
        other = asyncio.run(spread(urls, 4, "tok", tokens=40, model="other"))
        elapsed = time.monotonic() - t0
        ok_req = [i for i, a in enumerate(req) if a == (200, None)]
        # one envelope of burst 6 for both replicas (each alone would admit 6: 12 in all), + the refill
        assert 6 <= len(ok_req) <= 6 + math.floor(RATE * elapsed)
        assert all(a == (429, "envelope-empty") for a in req if a[0] != 200)
        ok_tok = sum(a == (200, None) for a in tok)
        assert 4 <= ok_tok <= math.floor((200 + elapsed) / 41)
        assert all(a == (429, "envelope-empty") for a in tok if a[0] != 200)
        assert other == [(200, None)] * 4

        # both replicas read the shared budget and backoff (admin API and metrics), not their own share
        def drained(g: GatewayProcess) -> dict[str, Any] | None:
            env = envelope(g, "req")
            return env if env["requests"]["remaining"] < 1 and env["in_backoff"] else None

        for g in gs:
            env = wait_for(lambda g=g: drained(g), 10, "the shared envelope state at every replica")
            assert 0 < env["backoff_remaining_s"] <= 1 / RATE
            text = g.metrics()
            assert metric(text, "envelope_remaining", tenant="req", target="*", unit="requests") < 1
            assert metric(text, "envelope_backoff_seconds", tenant="req", target="*") > 0
            assert g.state()["redis"]["envelopes_read_age_s"] < 5
        texts = [g.metrics() for g in gs]
        deferred = sum(metric(t, "deferred_total", tenant="req", reason="envelope-empty") for t in texts)
        assert deferred == 24 - len(ok_req)
        admitted = sum(envelope(g, "req")["admitted"] for g in gs)  # this replica's counters, summed
        assert admitted == len(ok_req)
        # the shared bucket nearing exhaustion alerted (metric + log line) at a replica that charged it
        assert sum(metric(t, "envelope_alerts_total", tenant="req", target="*", unit="requests") for t in texts) >= 1
        wait_for(lambda: any("envelope near exhaustion: tenant=req" in g.stderr() for g in gs), 5, "the alert line")
        wait_for(lambda: leases(rs) == 0, 10, "no lease left")
    finally:
        stop(gs)


def test_envelope_changes_reach_every_replica(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    cfg = config(rs, "closed", burst=2)
    gs = replicas(tmp_path, mock, cfg)
    try:
        assert asyncio.run(spread([gs[1].url], 3, "req")).count((200, None)) == 2
        status, body = gs[0].admin(
            "PUT",
            "/admin/tenants/req/envelopes/*",
            {"requests_per_s": 1000, "request_burst": 1000, "reason": "open up"},
        )
        assert status == 200, body
        wait_for(lambda: envelope(gs[1], "req")["config"]["requests_per_s"] == 1000, 10, "the change at replica 2")
        assert asyncio.run(spread([gs[1].url], 10, "req")) == [(200, None)] * 10  # and it binds there
        status, _ = gs[1].admin("DELETE", "/admin/tenants/tok/envelopes/mock")
        assert status == 200
        wait_for(lambda: gs[0].state()["tenants"]["tok"]["envelopes"] == [], 10, "the removal at replica 1")
        assert asyncio.run(spread([gs[0].url], 8, "tok", tokens=100)) == [(200, None)] * 8
        with redis.Redis.from_url(rs.url, decode_responses=True) as r:
            assert r.hget("admit:envelopes", "tok/mock") == "null"
        # a replica started later with the same file takes Redis's envelopes, not its file's
        (tmp_path / "late").mkdir()
        late = GatewayProcess(tmp_path / "late", mock.url, cfg)
        gs.append(late)
        st = late.state()["tenants"]
        assert st["tok"]["envelopes"] == []
        assert st["req"]["envelopes"][0]["config"]["request_burst"] == 1000
        assert [x["what"] for x in gs[0].audit_log()] == ["envelope"]  # audited where it was made
    finally:
        stop(gs)


def test_refunds_reach_the_shared_bucket(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    """Charged, then deferred by the (shared) limit: the envelope gets the unit back, at every replica."""
    gs = replicas(tmp_path, mock, config(rs, "closed"))
    try:

        def left(g: GatewayProcess) -> float:
            return float(envelope(g, "one")["requests"]["remaining"])

        async def run() -> tuple[list[Answer], Answer]:
            async with aiohttp.ClientSession() as s:
                long = asyncio.ensure_future(one(s, gs[0].url, "one", 60, stream=True))
                await asyncio.to_thread(wait_for, lambda: leases(rs) == 1, 20, "the one slot taken")
                full = []
                for _ in range(3):  # each is charged first, then finds the slot taken, then is refunded
                    full.append(await one(s, gs[1].url, "one"))
                    await asyncio.to_thread(wait_for, lambda: left(gs[1]) >= 1.99, 10, "the refund")
                return full, await long

        full, long = asyncio.run(run())
        assert long == (200, None)
        assert full == [(429, "queue-full")] * 3  # without refunds the third would have found no budget
        wait_for(lambda: left(gs[0]) >= 1.99, 10, "the refunded budget at the other replica")
        answers = []
        for i in range(3):  # one at a time, through the limit of 1, alternating replicas
            wait_for(lambda: leases(rs) == 0, 10, "the slot free")
            answers.append(asyncio.run(spread([gs[i % 2].url], 1, "one"))[0])
        assert answers == [(200, None), (200, None), (429, "envelope-empty")]
    finally:
        stop(gs)


def _outage(gs: list[GatewayProcess], mock: CountingMock, rs: RedisServer) -> tuple[list[Answer], int, int]:
    """Burst 4: two long requests (one per replica) run, both replicas see 2 left, Redis is killed, four
    requests go to each replica; Redis comes back. Returns the outage's answers (replica 1's four, then
    replica 2's) and, after recovery, how many of four requests pass and the most that could."""

    async def run() -> list[Answer]:
        async with aiohttp.ClientSession() as s:
            running = [asyncio.ensure_future(one(s, g.url, "req", 60, stream=True)) for g in gs]
            await asyncio.to_thread(wait_for, lambda: mock.counter.now == 2, 20, "two requests at the backend")
            for g in gs:  # each replica's mirror has seen the other's spend
                await asyncio.to_thread(
                    wait_for,
                    lambda g=g: envelope(g, "req")["requests"]["remaining"] < 3,
                    10,
                    "the shared budget at every replica",
                )
            assert leases(rs) == 2
            rs.kill()
            late = []
            for g in gs:
                late += await asyncio.gather(*(one(s, g.url, "req") for _ in range(4)))
            assert [await r for r in running] == [(200, None)] * 2  # what ran finishes
            return late

    wait_for(lambda: mock.counter.now == 0, what="an idle backend")
    t0 = time.monotonic()
    late = asyncio.run(run())
    for g in gs:
        st = g.state()["redis"]
        assert st["up"] is False and st["outages"] == 1
    rs.start()
    for g in gs:
        wait_for(lambda g=g: g.state()["redis"]["up"] and g.state()["redis"]["pending_releases"] == 0, 20, "recovery")
    wait_for(lambda: leases(rs) == 0, 10, "no lease left in Redis")  # the outage leaked no slot
    for g in gs:  # Redis's buckets are the truth again (what failing open spent here is not written back)
        wait_for(lambda g=g: envelope(g, "req")["requests"]["remaining"] >= 2, 10, "the shared budget re-read")
    after = asyncio.run(spread([g.url for g in gs], 4, "req"))
    most = 2 + math.floor(RATE * (time.monotonic() - t0))
    wait_for(lambda: leases(rs) == 0 and all(g.state()["in_flight"] == 0 for g in gs), 10, "drained")
    return late, after.count((200, None)), most


def test_redis_killed_mid_run_envelopes_fail_closed(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    gs = replicas(tmp_path, mock, config(rs, "closed", burst=4))
    try:
        late, ok_after, most = _outage(gs, mock, rs)
        assert late == [(503, "admission-unavailable")] * 8  # no shared budget, no admission
        assert 2 <= ok_after <= most  # the outage spent nothing
        for g in gs:
            assert g.state()["tenants"]["req"]["fail_closed_deferred"] == 4
            assert metric(g.metrics(), "deferred_total", tenant="req", reason="admission-unavailable") == 4
    finally:
        stop(gs)


def test_redis_killed_mid_run_envelopes_fail_open(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    gs = replicas(tmp_path, mock, config(rs, "open", burst=4))
    try:
        late, ok_after, most = _outage(gs, mock, rs)
        # each replica spends what it last saw left (2) on its own: replicas x 2 in all, then 429s
        for part in (late[:4], late[4:]):
            assert sorted(part) == [(200, None)] * 2 + [(429, "envelope-empty")] * 2
        assert 2 <= ok_after <= most  # back on Redis's bucket, which the outage's spends did not touch
        for g in gs:
            st = g.state()
            assert st["redis"]["envelope_fail_open_charged"] == 2 and st["redis"]["recoveries"] == 1
            assert st["tenants"]["req"]["fail_open_admitted"] == 2
    finally:
        stop(gs)


def quiet(rs: RedisServer, **tenant: Any) -> dict[str, Any]:
    """One tenant "q" with a requests envelope, and a Redis section whose refresh and lease renewal are far
    apart, so that what reaches Redis during a test is what its requests send."""
    env = {"target": "mock", "requests_per_s": RATE, "request_burst": 4}
    return {
        "redis": {"url": rs.url, "failure_mode": "closed", "lease_ttl_s": 300, "poll_s": 30, "timeout_s": 1},
        "tenants": [tenant_cfg("q", **{"limit": 1, "max_queue": 5, "queue_timeout_s": 60, "envelopes": [env],
                                       **tenant})],
    }


def redis_calls(rs: RedisServer) -> dict[str, int]:
    """Calls per Redis command since the last CONFIG RESETSTAT, this probe's own left out. Commands that
    scripts run are counted too, by name; EVALSHA is the scripts themselves."""
    with redis.Redis.from_url(rs.url) as r:
        stats = r.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return {k: v for k, v in calls.items() if k not in ("info", "hello", "config|resetstat") and v}


IN_SCRIPTS = {"time", "get", "set", "zremrangebyscore", "hget", "hset", "zcard", "zadd", "zrem"}


def test_a_granted_request_makes_one_redis_call_before_the_backend(
    tmp_path: Path, mock: CountingMock, rs: RedisServer
) -> None:
    """The envelope charge and the lease are one script: one EVALSHA between arrival and the backend (and one
    more, the release, after it); a request no envelope matches makes one too (the lease)."""
    g = GatewayProcess(tmp_path, mock.url, quiet(rs, limit=2))
    try:

        def idle() -> bool:
            return mock.counter.now == 0 and leases(rs, ("q",)) == 0

        async def run() -> dict[str, tuple[dict[str, int], dict[str, int]]]:
            out = {}
            async with aiohttp.ClientSession() as s:
                for model in ("mock", "other"):  # each path once first: redis-py loads the script (NOSCRIPT)
                    assert await one(s, g.url, "q", model=model) == (200, None)
                for model in ("mock", "other"):
                    await asyncio.to_thread(wait_for, idle, 10, "an idle backend and no lease")
                    with redis.Redis.from_url(rs.url) as r:
                        r.config_resetstat()
                    task = asyncio.ensure_future(one(s, g.url, "q", 40, model=model, stream=True))
                    await asyncio.to_thread(wait_for, lambda: mock.counter.now == 1, 10, "the request at the backend")
                    at_backend = redis_calls(rs)
                    assert await task == (200, None)
                    await asyncio.to_thread(wait_for, lambda: redis_calls(rs).get("zrem"), 10, "the release")
                    out[model] = at_backend, redis_calls(rs)
            return out

        calls = asyncio.run(run())
        for model, (at_backend, done) in calls.items():
            assert at_backend["evalsha"] == 1, (model, at_backend)
            assert set(at_backend) - {"evalsha"} <= IN_SCRIPTS, (model, at_backend)
            assert done["evalsha"] == 2 and done["zrem"] == 1, (model, done)
        assert calls["mock"][0]["zadd"] == 1 and "get" in calls["mock"][0]  # the lease and the bucket: one script
        assert "get" not in calls["other"][0]  # no envelope: no bucket read
        assert envelope(g, "q")["admitted"] == 2 and g.state()["tenants"]["q"]["admitted"] == 4
    finally:
        g.stop()


def test_a_full_limit_queues_then_admits_and_an_expired_wait_is_refunded(
    tmp_path: Path, mock: CountingMock, rs: RedisServer
) -> None:
    """Limit 1: a request charged while the slot is taken waits in the queue and is admitted when it frees
    (its charge stays spent); one whose wait outlives queue_timeout_s gets 429 ttl-expired and its unit back."""
    g = GatewayProcess(tmp_path, mock.url, quiet(rs, queue_timeout_s=2.5))

    def left() -> float:
        return float(envelope(g, "q")["requests"]["remaining"])

    async def pair(first_tokens: int) -> tuple[Answer, Answer]:
        async with aiohttp.ClientSession() as s:
            first = asyncio.ensure_future(one(s, g.url, "q", first_tokens, stream=True))
            await asyncio.to_thread(wait_for, lambda: mock.counter.now == 1, 10, "the first at the backend")
            second = await one(s, g.url, "q")
            return await first, second

    try:
        # the first holds the slot ~1.5 s (60 tokens, 25 ms apart), less than the second may wait
        assert asyncio.run(pair(60)) == ((200, None), (200, None))
        waits = [x["queue_wait_s"] for x in g.request_log()]
        assert waits[0] < 0.5 < waits[1]  # the second was queued
        assert 1.99 <= left() < 2.5  # 4 - 2 (plus the refill, 0.05/s)
        # now the first holds it ~3.75 s (150 tokens), longer than the second may wait: ttl-expired, refunded
        assert asyncio.run(pair(150)) == ((200, None), (429, "ttl-expired"))
        wait_for(lambda: left() >= 0.99, 10, "the refund")
        assert left() < 1.99  # one of the two spent (and not the other)
        wait_for(lambda: leases(rs, ("q",)) == 0, 10, "no lease left")
        assert g.state()["tenants"]["q"]["ttl_expired"] == 1
    finally:
        g.stop()


def test_a_script_error_stays_with_the_tenant_that_hit_it(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    """One tenant's keys in Redis hold what the scripts never write (its envelope's bucket is a list, another
    tenant's leases a string): its requests get 500 admission-error, every other tenant keeps getting 200s
    (not 503), Redis is never counted down, the script errors are counted and logged once, and the other
    envelopes' mirrors keep being read. Before, any script error marked Redis down and, failing closed,
    every tenant got 503 admission-unavailable until the key was fixed."""
    env = {"target": "*", "requests_per_s": 1000, "request_burst": 1000}
    cfg = {
        "redis": {"url": rs.url, "failure_mode": "closed", "lease_ttl_s": 30, "poll_s": 0.05, "timeout_s": 1},
        "tenants": [
            tenant_cfg("good", limit=8, envelopes=[env]),
            tenant_cfg("bad", limit=8, envelopes=[env]),
            tenant_cfg("badlease", limit=8),
        ],
    }
    g = GatewayProcess(tmp_path, mock.url, cfg)
    try:
        with redis.Redis.from_url(rs.url, decode_responses=True) as r:
            r.rpush("admit:gcra:bad/*:requests", "not a bucket")  # GET in the GCRA script: WRONGTYPE
            r.set("admit:leases:badlease", "not a sorted set")  # ZREMRANGEBYSCORE in ACQUIRE: WRONGTYPE

        async def run() -> dict[str, list[Answer]]:
            out: dict[str, list[Answer]] = {"good": [], "bad": [], "badlease": []}
            async with aiohttp.ClientSession() as s:
                # one after another, so that the good tenant's requests span many refreshes (every 0.2 s)
                t0 = time.monotonic()
                while len(out["good"]) < 20 or time.monotonic() - t0 < 1.5:
                    for tenant in out:
                        out[tenant].append(await one(s, g.url, tenant))
            return out

        got = asyncio.run(run())
        assert got["good"] == [(200, None)] * len(got["good"])
        assert set(got["bad"]) == set(got["badlease"]) == {(500, "admission-error")}
        st = g.state()["redis"]
        assert st["up"] is True and st["outages"] == 0 and st["errors"] == 0
        by = st["script_errors_by_script"]
        assert by["CHARGE_ACQUIRE"] == len(got["bad"]) and by["ACQUIRE"] == len(got["badlease"])
        assert by["READ"] >= 2 and by["GCRA"] >= 2  # the refreshes read each tenant and envelope alone
        assert st["script_errors"] == sum(by.values())
        text = g.metrics()
        assert metric(text, "redis_script_errors_total", script="CHARGE_ACQUIRE") == len(got["bad"])
        assert "admit_gateway_redis_outages_total 0.0" in text and "admit_gateway_redis_up 1.0" in text
        log = g.stderr()
        assert log.count("redis script CHARGE_ACQUIRE failed for tenant bad") == 1  # once per (script, message)
        assert "redis unreachable" not in log
        assert metric(text, "deferred_total", tenant="good", reason="admission-unavailable") == 0
        assert metric(text, "deferred_total", tenant="bad", reason="admission-error") == len(got["bad"])
        # the good tenant's mirror is still read from Redis (not only updated by its own charges): drain its
        # shared bucket behind the gateway's back and the state shows it within a refresh
        with redis.Redis.from_url(rs.url, decode_responses=True) as r:
            tat_us = float(r.time()[0]) * 1e6 + 60e6  # 60 s ahead at 1000/s: 60,000 units of debt
            r.set("admit:gcra:good/*:requests", f"{tat_us:.3f}", px=60_000)
        wait_for(lambda: envelope(g, "good")["requests"]["remaining"] < 1, 10, "the good envelope read again")
        with redis.Redis.from_url(rs.url) as r:  # the keys fixed: the tenants that hit them are served again
            r.delete("admit:gcra:bad/*:requests", "admit:leases:badlease", "admit:gcra:good/*:requests")
        assert asyncio.run(spread([g.url], 1, "bad")) == [(200, None)]
        assert asyncio.run(spread([g.url], 1, "badlease")) == [(200, None)]
        wait_for(lambda: leases(rs, ("good", "bad", "badlease")) == 0, 10, "no lease left")
        assert g.state()["redis"]["outages"] == 0
    finally:
        g.stop()

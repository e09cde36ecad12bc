"""The Redis backend in process against a real redis-server: a crashed replica's slots come back after the
lease TTL, renewal keeps a long request's lease, and the GCRA script is gcra.py's arithmetic on server time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from admit.gateway.admission import Lease
from admit.gateway.config import RedisConfig, TenantConfig
from admit.gateway.redis.admission import RedisAdmission
from admit.gateway.redis.scripts import GCRA
from redis_helpers import RedisServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]


def test_a_crashed_replicas_slots_come_back_after_the_lease_ttl(rs: RedisServer) -> None:
    cfg = RedisConfig(url=rs.url, lease_ttl_s=1.0, poll_s=0.05)
    tenants = [TenantConfig(name="a", limit=2, queue_timeout_s=20)]

    async def run() -> tuple[float, float, int]:
        dead, alive = RedisAdmission(tenants, cfg, "dead"), RedisAdmission(tenants, cfg, "alive")
        await dead.start()
        await alive.start()
        try:
            held = [await dead.acquire(0), await dead.acquire(0)]
            assert all(isinstance(x, Lease) for x in held)
            for task in dead._tasks:  # the replica dies: no renewal, no release
                task.cancel()
            t0 = time.monotonic()
            got = await asyncio.wait_for(alive.acquire(0), 15)  # queued until the dead leases expire
            waited = time.monotonic() - t0
            # a live replica's long request keeps its lease: renewal every ttl/3 outlives the TTL many times
            other = await asyncio.wait_for(alive.acquire(0), 15)
            r = aioredis.Redis.from_url(rs.url)
            held_now, until = 2, time.monotonic() + 2.5
            while time.monotonic() < until and held_now == 2:  # watched for 2.5 TTLs: never dropped
                held_now = await r.zcard("admit:leases:a")
                await asyncio.sleep(0.05)
            await r.aclose()
            alive.release(got)
            alive.release(other)
            return waited, alive.stats.leases_expired, held_now
        finally:
            await alive.close()
            await dead.r.aclose()

    waited, expired, held_now = asyncio.run(run())
    assert 0.5 <= waited < 10  # not at once (the slots were taken), and not never
    assert expired == 2 and held_now == 2


def test_gcra_script_mirrors_gcra_py(rs: RedisServer) -> None:
    async def run() -> list[list[str]]:
        r = aioredis.Redis.from_url(rs.url, decode_responses=True)
        script = r.register_script(GCRA)
        out = []
        for _ in range(4):  # rate 2/s, burst 3: three pass at once, the fourth waits ~0.5 s
            out.append(await script(keys=["b:req", "b:backoff"], args=["spend", 1, 2, 3, 1]))
        # two buckets, one empty: nothing is charged anywhere (all or nothing)
        out.append(await script(keys=["b:tok", "b:req"], args=["spend", 2, 100, 100, 10, 2, 3, 1]))
        out.append(await script(keys=["b:tok"], args=["read", 1, 100, 100, 0]))
        out.append(await script(keys=["b:req"], args=["refund", 1, 2, 3, 1]))
        out.append(await script(keys=["b:req"], args=["spend", 1, 2, 3, 1]))
        await r.aclose()
        return out

    res = asyncio.run(run())
    assert [x[0] for x in res[:3]] == [1, 1, 1]
    assert float(res[2][3]) == pytest.approx(1.5, abs=0.05)  # 3 units of 0.5 s ahead: nothing left
    assert float(res[2][4]) == 0  # no backoff while admitted
    assert res[3][0] == 0 and res[3][1] == 1 and 0.3 < float(res[3][2]) <= 0.5
    assert float(res[3][4]) == pytest.approx(float(res[3][2]), abs=1e-3)  # the deferral started the backoff
    assert res[4][0] == 0 and res[4][1] == 2  # the request bucket defers
    assert float(res[5][3]) == 0  # the token bucket was not charged (no debt: 100 of 100 left)
    assert res[7][0] == 1  # the refunded unit can be spent again at once


def test_the_gcra_script_passes_a_full_buckets_spend_of_its_burst_or_more(rs: RedisServer) -> None:
    """gcra.py's test on the debt, in Lua, where the clock is server microseconds (about 1.8e15): a spend whose
    microseconds are of that size (0.001 tokens/s, a burst of 1, a charge of millions of tokens) must pass a
    full bucket as a small one does."""
    async def run() -> list[int]:
        r = aioredis.Redis.from_url(rs.url, decode_responses=True)
        script = r.register_script(GCRA)
        out = []
        for i in range(300):  # a fresh (full) bucket each time
            qty = 1_000_000 + 29_989 * i  # 1e15 .. 1e16 microseconds at 0.001/s
            out.append(int((await script(keys=[f"f:{i}:a"], args=["spend", 1, 0.001, 1, qty]))[0]))
            out.append(int((await script(keys=[f"f:{i}:b"], args=["spend", 1, 0.001, 1, 1]))[0]))
        await r.aclose()
        return out

    got = asyncio.run(run())
    assert got.count(1) == len(got), f"{got.count(0)} of {len(got)} spends from a full bucket were deferred"


def test_both_backends_set_limits_through_one_check(rs: RedisServer) -> None:
    """The limit-setting rule lives once (admission.TenantSlots): same answers, same errors, in both backends."""
    from admit.gateway.local_admission import LocalAdmission

    tenants = [TenantConfig(name="a", limit=2), TenantConfig(name="b", limit=5)]

    async def run() -> list[tuple[int, int, list[str]]]:
        shared = RedisAdmission(tenants, RedisConfig(url=rs.url), "r1")
        await shared.start()
        try:
            out = []
            for adm in (LocalAdmission(tenants), shared):
                errors = []
                for bad in (-1, 2.5, True, "3", None):
                    with pytest.raises(ValueError) as exc:
                        adm.set_limit(0, bad)  # type: ignore[arg-type]
                    errors.append(str(exc.value))
                old = adm.set_limit(0, 7)
                out.append((old, adm.limit(0), errors))
            return out
        finally:
            await shared.close()

    local, shared = asyncio.run(run())
    assert local == shared
    assert local[0] == 2 and local[1] == 7
    assert local[2][0] == "limit must be an integer >= 0, got -1"
    assert local[2][1] == "limit must be an integer >= 0, got 2.5"


def test_envelope_configs_in_redis_are_seeded_once_and_bad_values_are_ignored(
    rs: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    from admit.gateway.config import EnvelopeConfig
    from admit.gateway.redis.envelopes import SharedEnvelopeBook

    tenants = [TenantConfig(name="a", limit=2)]
    cfg = RedisConfig(url=rs.url)

    async def replica(name: str, rate: float) -> tuple[RedisAdmission, SharedEnvelopeBook]:
        adm = RedisAdmission(tenants, cfg, name)
        await adm.start()
        book = SharedEnvelopeBook(cfg, time.monotonic)
        book.configure("a", EnvelopeConfig(target="*", requests_per_s=rate, request_burst=5), time.monotonic())
        await book.attach(adm)
        return adm, book

    async def run() -> tuple[list[float], list[str]]:
        adm1, book1 = await replica("r1", 5.0)
        adm2, book2 = await replica("r2", 1.0)  # its file says 1/s, but Redis already holds 5/s: Redis wins
        try:
            r = aioredis.Redis.from_url(rs.url, decode_responses=True)
            await r.hset("admit:envelopes", mapping={"a/bad": "{not json", "a/neg": '{"requests_per_s": -1}',
                                                     "nobody/*": '{"requests_per_s": 1}'})
            await r.aclose()
            await book1.refresh()  # neither raises nor takes them
            rates = [env.cfg.requests_per_s or 0 for book in (book1, book2) for env in book.envelopes("a")]
            targets = [env.cfg.target for env in book1.envelopes("a")]
            return rates, targets
        finally:
            await adm1.close()
            await adm2.close()

    with caplog.at_level("WARNING", logger="admit.gateway.redis"):
        rates, targets = asyncio.run(run())
    assert rates == [5.0, 5.0] and targets == ["*"]
    warned = [m for m in caplog.messages if "not a valid config" in m]
    assert len(warned) == 2 and any("a/bad" in m for m in warned) and any("a/neg" in m for m in warned)


def test_set_envelope_keeps_the_debt_in_units(rs: RedisServer) -> None:
    """SET_ENVELOPE does what gcra.py's reconfigure does, on the shared buckets: the debt is kept in units
    (the old rates read from the old config in Redis), capped to the new burst, so a raise frees budget at
    once and a cut never leaves more than the new burst; the same config changes nothing; and a bucket whose
    old rate is unknown keeps its debt in time (capped), as before."""
    import json

    from admit.gateway.config import EnvelopeConfig
    from admit.gateway.redis.scripts import SET_ENVELOPE

    cfg_key, req, tok, backoff = "admit:envelopes", "b:req", "b:tok", "b:backoff"

    async def run() -> dict[str, Any]:
        r = aioredis.Redis.from_url(rs.url, decode_responses=True)
        gcra, setenv = r.register_script(GCRA), r.register_script(SET_ENVELOPE)

        async def configure(field: str = "t/*", **env: Any) -> None:
            cfg = EnvelopeConfig(**env)
            rates = [cfg.requests_per_s or 0, cfg.request_burst_or_default if cfg.requests_per_s else 0,
                     cfg.tokens_per_s or 0, cfg.token_burst_or_default if cfg.tokens_per_s else 0]
            value = json.dumps(cfg.model_dump(), sort_keys=True, separators=(",", ":"))
            versions = ["admit:tenant_versions", "admit:version"]  # the change is numbered there
            await setenv(keys=[cfg_key, req, tok, backoff, *versions], args=[field, value, *rates, field[0], 0, 0])

        async def spend(key: str, rate: float, burst: int, qty: float) -> None:
            got = await gcra(keys=[key], args=["spend", 1, rate, burst, qty])
            assert got[0] == 1, got

        async def left(key: str, rate: float, burst: int) -> tuple[float, float]:
            """(remaining, seconds since the last change at most): the refill since bounds the tolerance."""
            got = await gcra(keys=[key], args=["read", 1, rate, burst, 0])
            return burst - float(got[3]) * rate, time.monotonic()

        out: dict[str, Any] = {}
        # raise: drained 0.5 req/s burst 2 (the gateway test's envelope) and 60 of 100 tokens at 10/s
        await configure(requests_per_s=0.5, request_burst=2, tokens_per_s=10, token_burst=100)
        t0 = time.monotonic()
        await spend(req, 0.5, 2, 2)
        await spend(tok, 10, 100, 60)
        await configure(requests_per_s=1000, request_burst=1000, tokens_per_s=100, token_burst=1000)
        out["raise_req"] = (*await left(req, 1000, 1000), t0)
        out["raise_tok"] = (*await left(tok, 100, 1000), t0)
        out["raise_spend"] = await gcra(keys=[req], args=["spend", 1, 1000, 1000, 1])
        # cut: 30 of 100 spent at 10/s, then burst 50 at 1/s, then burst 10 (less than the debt) at 1/s
        await r.delete(req, tok)
        await configure(requests_per_s=10, request_burst=100)
        t0 = time.monotonic()
        await spend(req, 10, 100, 30)
        await configure(requests_per_s=1, request_burst=50)
        out["cut"] = (*await left(req, 1, 50), t0)
        t0 = time.monotonic()
        await configure(requests_per_s=1, request_burst=10)
        out["cut_below_debt"] = (*await left(req, 1, 10), t0)
        # unchanged: an oversize spend's debt (20 units, burst 5) is not capped by the same config again
        await r.delete(req)
        await configure(requests_per_s=10, request_burst=5)
        await spend(req, 10, 5, 20)
        before = await r.get(req)
        await configure(requests_per_s=10, request_burst=5)
        out["unchanged"] = before, await r.get(req)
        # no old config (the field is gone): the old rate is unknown, the debt is kept in time, capped
        await r.delete(req)
        await configure(field="u/*", requests_per_s=0.5, request_burst=2)
        t0 = time.monotonic()
        await spend(req, 0.5, 2, 2)
        await r.hdel(cfg_key, "u/*")
        await configure(field="u/*", requests_per_s=1000, request_burst=1000)
        out["unknown"] = (*await left(req, 1000, 1000), t0)
        await r.aclose()
        return out

    out = asyncio.run(run())

    def near(name: str, expected: float, rate: float) -> None:
        """``expected`` up to the refill since the spend (``rate``: the fastest of the old and new rates)."""
        value, t1, t0 = out[name]
        assert expected - 1e-3 <= value <= expected + rate * (t1 - t0) + 1e-3, (name, value, expected)

    near("raise_req", 998, 1000)  # kept in time (4 s at 1000/s, capped to 1 s) it would be 0
    near("raise_tok", 940, 100)  # the used fraction (60%) would leave 400
    assert out["raise_spend"][0] == 1
    near("cut", 20, 10)  # 50 - the 30 spent; never more than the new burst (nor the 70 left before)
    near("cut_below_debt", 0, 1)  # 30 units of debt, capped to the new burst of 10
    assert out["unchanged"][0] == out["unchanged"][1]
    near("unknown", 0, 1000)


def test_script_errors_are_told_from_outages() -> None:
    """What marks Redis down (every call would fail alike) and what is one call's script error."""
    from admit.gateway.redis.admission import is_script_error
    from redis.exceptions import (
        BusyLoadingError,
        NoScriptError,
        OutOfMemoryError,
        ReadOnlyError,
        ResponseError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    outages = [RedisConnectionError("refused"), RedisTimeoutError("timeout"), BusyLoadingError("loading"),
               OSError("reset"), TimeoutError(), NoScriptError("no script"), ReadOnlyError("replica"),
               OutOfMemoryError("command not allowed"), ResponseError("BUSY Redis is busy running a script"),
               ResponseError("MISCONF Redis is configured to save RDB snapshots")]
    scripts = [ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value script: x"),
               ResponseError("ERR user_script:12: attempt to compare nil with number script: x")]
    assert [is_script_error(e) for e in outages] == [False] * len(outages)
    assert [is_script_error(e) for e in scripts] == [True] * len(scripts)


def test_a_broken_lease_key_answers_its_queued_request_and_blocks_no_recovery(rs: RedisServer) -> None:
    """Tenant b's sorted set holds a string: its queued request gets 500 admission-error at once (not after
    its TTL), tenant a is served and read as before, Redis is never counted down; and when Redis is killed
    and comes back with that key still broken, recovery completes (b's renewal and pending release are
    dropped and counted) instead of leaving Redis down for everyone."""
    from admit.gateway.admission import Deferred
    from admit.gateway.redis.admission import ADMISSION_ERROR, AdmissionError

    tenants = [TenantConfig(name="a", limit=2, queue_timeout_s=20), TenantConfig(name="b", limit=1, queue_timeout_s=20)]
    cfg = RedisConfig(url=rs.url, failure_mode="closed", poll_s=0.05, lease_ttl_s=30, timeout_s=1)

    async def until(pred: Any, what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)

    async def run() -> None:
        adm = RedisAdmission(tenants, cfg, "r1")
        await adm.start()
        r = aioredis.Redis.from_url(rs.url, decode_responses=True)
        try:
            held_a, held_b = await adm.acquire(0), await adm.acquire(1)
            waiting = asyncio.ensure_future(adm.acquire(1))  # b's limit is 1: queued
            await until(lambda: adm.queue_depth(1) == 1, "b's request queued")
            await r.set("admit:leases:b", "not a sorted set")
            t0 = time.monotonic()
            adm.release(held_b)  # RELEASE fails (dropped), the queue's head tries and fails: its own answer
            with pytest.raises(AdmissionError) as exc:
                await asyncio.wait_for(waiting, 10)
            assert time.monotonic() - t0 < 5  # not its 20 s TTL
            assert isinstance(exc.value, Deferred) and exc.value.status == 500
            assert exc.value.reason == ADMISSION_ERROR and exc.value.retry_after_s is None
            with pytest.raises(AdmissionError):
                await adm.acquire(1)
            other = await adm.acquire(0)  # a is served, and its shared count read, as before
            await until(lambda: adm.shared[0] == 2 and adm.stats.script_errors_by.get("READ", 0) >= 2,
                        "a's leases read alone while b's key is broken")
            adm.release(other)
            assert adm.up and adm.stats.outages == 0 and adm.stats.errors == 0
            by = adm.stats.script_errors_by
            assert by["ACQUIRE"] == 2 and by["RELEASE"] == 1
            assert adm.snapshot()["redis"]["script_errors"] == adm.stats.script_errors == sum(by.values())
            # an outage with b's key still broken: b holds a lease again (written before the key broke)
            await r.delete("admit:leases:b")
            held_b = await adm.acquire(1)
            await r.set("admit:leases:b", "not a sorted set")
            rs.kill()
            await until(lambda: not adm.up, "the outage seen")
            adm.release(held_b)  # pending: sent again at recovery, where it fails on the broken key
            assert len(adm.pending_release) == 1
            rs.start()
            await until(lambda: adm.up, "recovered with b's key broken", timeout=20)
            assert adm.stats.outages == 1 and adm.stats.recoveries == 1 and not adm.pending_release
            await r.aclose()
            r = aioredis.Redis.from_url(rs.url, decode_responses=True)  # this one's socket died with the server
            assert await r.zcard("admit:leases:a") == 1  # a's running lease written back
            adm.release(held_a)
            await until(lambda: adm.shared[0] == 0, "a's lease released")
        finally:
            await r.aclose()
            await adm.close()

    asyncio.run(run())

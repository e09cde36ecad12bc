"""The envelope charge and the lease in one Redis script (``SharedEnvelopeBook.charge_and_acquire``), in
process against a real redis-server: one EVALSHA when both are granted, no lease when the envelope is empty,
the queue (without asking Redis again) when the limit is full, a lease granted to a caller that left is
released, and a Redis that is gone follows ``failure_mode`` as the two separate calls did."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
from admit.gateway.admission import ADMISSION_UNAVAILABLE, Deferred, Lease
from admit.gateway.config import EnvelopeConfig, RedisConfig, TenantConfig
from admit.gateway.envelopes import Charge, Deferral
from admit.gateway.redis.admission import ADMISSION_ERROR, AdmissionError, RedisAdmission, RedisLease
from admit.gateway.redis.envelopes import SharedCharge, SharedEnvelopeBook
from redis_helpers import RedisServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]
T = TypeVar("T")


# what the scripts run inside Redis (INFO commandstats counts those too): anything else is a command of its own
IN_SCRIPTS = {"time", "get", "set", "zremrangebyscore", "hget", "hset", "zcard", "zadd"}


def scripts_called(url: str) -> int:
    """EVALSHA calls since the last ``CONFIG RESETSTAT``, checking that no other command was sent."""
    calls = redis_calls(url)
    assert set(calls) - {"evalsha"} <= IN_SCRIPTS, calls
    return calls.get("evalsha", 0)


def redis_calls(url: str) -> dict[str, int]:
    """Calls per Redis command since the last ``CONFIG RESETSTAT`` (this probe's own connection, INFO and
    CONFIG RESETSTAT left out)."""
    with redis.Redis.from_url(url) as r:
        stats = r.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return {k: v for k, v in calls.items() if k not in ("info", "hello", "config|resetstat") and v}


def reset_stats(url: str) -> None:
    with redis.Redis.from_url(url) as r:
        r.config_resetstat()


def zcard(url: str, tenant: str = "a") -> int:
    with redis.Redis.from_url(url) as r:
        return int(r.zcard(f"admit:leases:{tenant}"))


async def replica(
    rs: RedisServer, mode: str = "closed", limit: int = 1, burst: int = 3, max_queue: int = 5
) -> tuple[RedisAdmission, SharedEnvelopeBook]:
    """One replica's backends; refresh and renewal far apart, so that only the calls under test reach Redis."""
    cfg = RedisConfig(url=rs.url, failure_mode=mode, poll_s=30, lease_ttl_s=300, timeout_s=1)
    adm = RedisAdmission([TenantConfig(name="a", limit=limit, max_queue=max_queue, queue_timeout_s=20)], cfg, "r1")
    await adm.start()
    book = SharedEnvelopeBook(cfg, time.monotonic)
    book.configure("a", EnvelopeConfig(target="*", requests_per_s=0.01, request_burst=burst), time.monotonic())
    await book.attach(adm)
    return adm, book


def run(rs: RedisServer, body: Callable[[RedisAdmission, SharedEnvelopeBook], Awaitable[T]], **kw: Any) -> T:
    async def main() -> T:
        adm, book = await replica(rs, **kw)
        try:
            return await body(adm, book)
        finally:
            await adm.close()

    return asyncio.run(main())


def remaining(book: SharedEnvelopeBook) -> float:
    (env,) = book.envelopes("a")
    return env.buckets["requests"].remaining(time.monotonic())


def test_charge_and_lease_granted_in_one_script_call(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        lease = await adm.acquire(0)  # the scripts are loaded (a first EVALSHA of each is NOSCRIPT)
        adm.release(lease)
        got, lease, asked = await book.charge_and_acquire(0, "m", 10)
        adm.release(lease)
        await asyncio.sleep(0.1)
        reset_stats(rs.url)
        got, lease, asked = await book.charge_and_acquire(0, "m", 10)
        assert scripts_called(rs.url) == 1  # charge and lease: one round trip, nothing else
        assert isinstance(got, SharedCharge) and isinstance(lease, Lease) and not asked
        assert zcard(rs.url) == 1 and list(adm.live.values()) == [0]
        assert adm.local[0] == 1 and adm.admitted[0] == 3 and adm.shared[0] == 1
        (env,) = book.envelopes("a")
        assert env.admitted == 2 and env.deferred == 0
        assert remaining(book) == pytest.approx(1, abs=0.05)  # burst 3, two charged
        adm.release(lease)
        await asyncio.sleep(0.1)
        assert zcard(rs.url) == 0 and not adm.live

    run(rs, body, limit=3)


def test_an_empty_envelope_takes_no_lease(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        leases = []
        for _ in range(2):  # the burst of 2, each with its lease (limit 3)
            got, lease, asked = await book.charge_and_acquire(0, "m", 10)
            assert isinstance(got, Charge) and lease is not None and not asked
            leases.append(lease)
        reset_stats(rs.url)
        got, lease, asked = await book.charge_and_acquire(0, "m", 10)
        assert scripts_called(rs.url) == 1
        assert isinstance(got, Deferral) and got.unit == "requests" and got.retry_after_s > 1
        assert lease is None and not asked
        assert zcard(rs.url) == 2 and len(adm.live) == 2 and adm.local[0] == 2 and adm.admitted[0] == 2
        (env,) = book.envelopes("a")
        assert env.deferred == 1 and env.admitted == 2 and env.backoff_until > time.monotonic()
        for lease in leases:
            adm.release(lease)

    run(rs, body, limit=3, burst=2)


def test_a_full_limit_queues_without_asking_again_then_admits(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        _, first, _ = await book.charge_and_acquire(0, "m", 10)
        assert first is not None
        got, lease, asked = await book.charge_and_acquire(0, "m", 10)
        assert isinstance(got, SharedCharge) and lease is None and asked  # charged, no slot free
        assert zcard(rs.url) == 1 and len(adm.live) == 1  # the id it tried with is dropped
        assert remaining(book) == pytest.approx(1, abs=0.05)  # the charge stays spent while it waits
        waiting = asyncio.ensure_future(adm.acquire(0, asked=True))
        await asyncio.sleep(0.2)
        assert not waiting.done() and adm.queue_depth(0) == 1
        # queued behind it, a third request is only charged (the queue goes first), then queues too
        got3, lease3, asked3 = await book.charge_and_acquire(0, "m", 10)
        assert isinstance(got3, SharedCharge) and lease3 is None and not asked3
        adm.release(first)
        second = await asyncio.wait_for(waiting, 10)
        assert second.waited_s > 0.1 and zcard(rs.url) == 1
        assert remaining(book) == pytest.approx(0, abs=0.05)
        adm.release(second)
        await asyncio.sleep(0.1)
        assert zcard(rs.url) == 0 and not adm.live

    run(rs, body, limit=1, burst=3)


def test_a_full_queue_defers_after_one_call_and_the_refund_returns_the_unit(rs: RedisServer) -> None:
    """What the gateway does with ``asked``: queue-full from the same call, then the refund (as before)."""

    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        _, first, _ = await book.charge_and_acquire(0, "m", 10)
        assert first is not None
        reset_stats(rs.url)
        got, lease, asked = await book.charge_and_acquire(0, "m", 10)
        assert asked and lease is None and isinstance(got, SharedCharge)
        with pytest.raises(Deferred) as exc:
            await adm.acquire(0, asked=True)
        assert exc.value.reason == "queue-full"
        assert scripts_called(rs.url) == 1  # the queue did not ask Redis again
        assert remaining(book) == pytest.approx(1, abs=0.05)
        book.refund(got, time.monotonic())
        await asyncio.sleep(0.2)
        assert remaining(book) == pytest.approx(2, abs=0.05)
        adm.release(first)

    run(rs, body, limit=1, burst=3, max_queue=0)


def test_the_lease_id_is_known_before_the_script_answers(rs: RedisServer) -> None:
    """So that a lease granted to a caller that left while the script ran is still found and released."""

    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        task = asyncio.ensure_future(book.charge_and_acquire(0, "m", 10))
        await asyncio.sleep(0)  # the script is on its way
        (lid,) = adm.live
        got, lease, asked = await task
        assert isinstance(lease, RedisLease) and lease.id == lid and zcard(rs.url) == 1
        adm.forget(0, lid)  # what a caller that left does with it
        deadline = time.monotonic() + 5
        while zcard(rs.url) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not adm.live and zcard(rs.url) == 0

    run(rs, body, limit=3)


def test_redis_gone_fails_closed(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        rs.kill()
        with pytest.raises(Deferred) as exc:
            await book.charge_and_acquire(0, "m", 10)
        assert exc.value.reason == ADMISSION_UNAVAILABLE and exc.value.status == 503
        assert not adm.up and adm.stats.fail_closed_deferred == [1] and adm.stats.errors == 1
        await asyncio.sleep(0.1)
        assert not adm.live and adm.local[0] == 0  # the id it tried with waits to be released when Redis is back
        assert [lid for _, lid in adm.pending_release] == ["r1:1"]
        with pytest.raises(Deferred):  # down now: the failure mode's answer without trying Redis
            await book.charge_and_acquire(0, "m", 10)
        assert adm.stats.fail_closed_deferred == [2] and adm.stats.errors == 1

    run(rs, body, mode="closed", limit=3)


def test_redis_gone_fails_open(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        rs.kill()
        got, lease, asked = await book.charge_and_acquire(0, "m", 10)
        assert isinstance(got, Charge) and not isinstance(got, SharedCharge)  # charged on the mirror
        assert lease is None and not asked  # the caller acquires as usual: the local limit
        assert not adm.up and book.fail_open_charged == 1
        local = await adm.acquire(0)
        assert adm.stats.fail_open_admitted == [1]
        adm.release(local)

    run(rs, body, mode="open", limit=3)


def test_no_envelope_asks_redis_nothing_more(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        book.remove("a", "*")
        await asyncio.sleep(0.1)
        reset_stats(rs.url)
        got, lease, asked = await book.charge_and_acquire(0, "m", 10)
        assert redis_calls(rs.url) == {}  # no envelope: nothing asked here, the lease is acquire()'s
        assert isinstance(got, Charge) and not got.items and lease is None and not asked

    run(rs, body)


def broken_bucket(url: str) -> None:
    """Tenant a's envelope bucket holds a list: the GCRA in the combined script fails (WRONGTYPE)."""
    with redis.Redis.from_url(url) as r:
        r.delete("admit:gcra:a/*:requests")
        r.rpush("admit:gcra:a/*:requests", "not a bucket")


def test_a_script_error_fails_closed_for_that_request_alone(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        broken_bucket(rs.url)
        with pytest.raises(AdmissionError) as exc:
            await book.charge_and_acquire(0, "m", 10)
        assert exc.value.status == 500 and exc.value.reason == ADMISSION_ERROR
        assert adm.up and adm.stats.errors == 0 and adm.stats.outages == 0
        assert adm.stats.script_errors_by == {"CHARGE_ACQUIRE": 1} and adm.stats.fail_closed_deferred == [0]
        assert not adm.live and zcard(rs.url) == 0  # the script that failed took no lease
        with pytest.raises(AdmissionError):  # still up: the next request asks Redis again, and fails alike
            await book.charge_and_acquire(0, "m", 10)
        assert adm.stats.script_errors == 2
        with redis.Redis.from_url(rs.url) as r:
            r.delete("admit:gcra:a/*:requests")
        got, lease, _ = await book.charge_and_acquire(0, "m", 10)  # fixed: served from Redis again
        assert isinstance(got, SharedCharge) and lease is not None
        adm.release(lease)

    run(rs, body, mode="closed", limit=3)


def test_a_script_error_fails_open_for_that_request_alone(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        broken_bucket(rs.url)
        got, lease, asked = await book.charge_and_acquire(0, "m", 10)
        assert isinstance(got, Charge) and not isinstance(got, SharedCharge)  # charged on the mirror
        assert lease is None and not asked and book.fail_open_charged == 1
        assert remaining(book) == pytest.approx(2, abs=0.05)
        assert adm.up and adm.stats.outages == 0 and adm.stats.script_errors_by == {"CHARGE_ACQUIRE": 1}
        shared = await adm.acquire(0)  # the lease's own script is fine: a shared lease, not a local one
        assert isinstance(shared, RedisLease) and zcard(rs.url) == 1 and adm.stats.fail_open_admitted == [0]
        adm.release(shared)

    run(rs, body, mode="open", limit=3)


async def until(pred: Callable[[], Any], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_settle_charges_the_real_tokens_in_the_shared_bucket(rs: RedisServer) -> None:
    """A request charged 30 tokens up front that used 90: the 60 more go to Redis's token bucket (a later
    charge defers, at another replica too), beyond the burst if need be; fewer tokens are given back; the
    requests bucket is untouched; a settle that cannot reach Redis is dropped and counted."""

    def left(book: SharedEnvelopeBook, target: str, unit: str) -> float:
        env = next(e for e in book.envelopes("a") if e.cfg.target == target)
        return env.buckets[unit].remaining(time.monotonic())

    def tokens_left(book: SharedEnvelopeBook) -> float:
        return left(book, "m", "tokens")

    async def body(adm: RedisAdmission, book: SharedEnvelopeBook) -> None:
        book.configure("a", EnvelopeConfig(target="m", tokens_per_s=1, token_burst=100), time.monotonic())
        await until(lambda: book.stats()["envelope_configs_pending"] == 0, "the tokens envelope in Redis")
        got, lease, _ = await book.charge_and_acquire(0, "m", 30)
        assert isinstance(got, SharedCharge) and lease is not None
        adm.release(lease)
        book.settle(got, 90, time.monotonic())
        await until(lambda: book.settled == 1, "the settle written")
        assert tokens_left(book) == pytest.approx(10, abs=0.5)  # the mirror took Redis's answer
        assert left(book, "*", "requests") == pytest.approx(2, abs=0.05)  # one request, whatever it generated
        other_adm, other = await replica(rs, limit=3)  # another replica, reading Redis only
        try:
            denied = await other.charge_shared("a", "m", 20)
            assert isinstance(denied, Deferral) and denied.unit == "tokens"
            assert denied.retry_after_s == pytest.approx(90 + 20 - 100, abs=0.5)  # 10 tokens short at 1/s
        finally:
            await other_adm.close()
        small = await book.charge_shared("a", "m", 5)
        assert isinstance(small, SharedCharge)
        book.settle(small, 300, time.monotonic())  # far beyond the burst: forced in
        await until(lambda: book.settled == 2, "the second settle written")
        assert tokens_left(book) == 0
        denied = await book.charge_shared("a", "m", 1)
        assert isinstance(denied, Deferral) and denied.retry_after_s == pytest.approx(90 + 300 + 1 - 100, abs=1)
        with redis.Redis.from_url(rs.url) as r:  # a clean bucket for the other direction
            r.delete("admit:gcra:a/m:tokens")
        big = await book.charge_shared("a", "m", 80)
        assert isinstance(big, SharedCharge)
        book.settle(big, 30, time.monotonic())  # 50 fewer than charged: given back
        await until(lambda: book.settled == 3, "the third settle written")
        assert tokens_left(book) == pytest.approx(70, abs=0.5)
        book.settle(big, 80, time.monotonic())  # exactly what was charged: nothing to send
        rs.kill()
        book.settle(small, 10, time.monotonic())
        await until(lambda: book.settles_dropped == 1, "the settle dropped")
        assert book.settled == 3 and not adm.up
        assert book.stats()["envelope_settles_dropped"] == 1

    run(rs, body, limit=3)

"""A request of a tenant with a contract on the Redis backend: its class, the envelopes' charge and the lease in
one script (``SharedEnvelopeBook.classify_and_acquire``, gateway/redis/scripts.py ``CONTRACT_ACQUIRE``), in
process against a real redis-server: one EVALSHA per request, the classes core/contract.py's classify gives on
the times the script returns, a deferral by an envelope still classified and taking no lease, a full limit
queueing by class without asking Redis again, the tenant's queue first, and a script error or a Redis that is
gone following ``failure_mode`` as the separate calls did."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
from admit.core.contract import Contract, classify
from admit.gateway.admission import ADMISSION_UNAVAILABLE, Deferred, Lease
from admit.gateway.config import EnvelopeConfig, RedisConfig, TenantConfig
from admit.gateway.envelopes import Deferral
from admit.gateway.redis.admission import ADMISSION_ERROR, AdmissionError, RedisAdmission
from admit.gateway.redis.contracts import SharedContracts
from admit.gateway.redis.envelopes import SharedCharge, SharedEnvelopeBook
from redis_helpers import RedisServer
from test_redis_charge_acquire import IN_SCRIPTS, redis_calls, reset_stats, zcard

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]
T = TypeVar("T")

C = Contract(requests_per_s=200.0, burst=5, attainment=0.9)
SLOW = Contract(requests_per_s=0.001, burst=2, attainment=0.9)

Parts = tuple[RedisAdmission, SharedEnvelopeBook, SharedContracts]


def run(rs: RedisServer, body: Callable[[RedisAdmission, SharedEnvelopeBook, SharedContracts], Awaitable[T]],
        contract: Contract = C, mode: str = "closed", limit: int = 100, envelope_burst: int | None = None) -> T:
    """One replica's backends (refresh and renewal far apart, so that only the calls under test reach Redis)."""

    async def main() -> T:
        cfg = RedisConfig(url=rs.url, failure_mode=mode, poll_s=30, lease_ttl_s=300, timeout_s=1)
        tenants = [TenantConfig(name="a", limit=limit, max_queue=5, queue_timeout_s=20, contract=contract)]
        adm = RedisAdmission(tenants, cfg, "r1")
        await adm.start()
        book = SharedEnvelopeBook(cfg, time.monotonic)
        if envelope_burst is not None:
            book.configure("a", EnvelopeConfig(target="*", requests_per_s=0.01, request_burst=envelope_burst),
                           time.monotonic())
        await book.attach(adm)
        contracts = SharedContracts(cfg, ["a"], [contract])
        await contracts.attach(adm)
        try:
            return await body(adm, book, contracts)
        finally:
            await adm.close()

    return asyncio.run(main())


async def warm(adm: RedisAdmission, book: SharedEnvelopeBook, contracts: SharedContracts) -> None:
    """Load the script (a first EVALSHA is NOSCRIPT, then loaded) and let the release land."""
    _, _, lease, _ = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
    assert lease is not None
    adm.release(lease)
    await asyncio.sleep(0.1)


@pytest.mark.parametrize("envelope", [False, True])
def test_class_and_lease_in_one_script_call_as_core_classify_decides(rs: RedisServer, envelope: bool) -> None:
    """600 requests as fast as one client sends them (most within one refill of the 200/s contract): one
    EVALSHA each, with or without a matching rate envelope; the classes are core's classify on the returned
    times, the numbers count up, every request got its lease."""

    async def body(adm: RedisAdmission, book: SharedEnvelopeBook, contracts: SharedContracts) -> list[Any]:
        await warm(adm, book, contracts)
        out = []
        reset_stats(rs.url)
        for _ in range(600):
            got_class, charge, lease, asked = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
            assert isinstance(lease, Lease) and not asked
            assert isinstance(charge, SharedCharge) == envelope
            out.append(got_class)
            adm.release(lease)
        await asyncio.sleep(0.2)  # the releases land
        calls = redis_calls(rs.url)
        # one script per request; the releases (RELEASE: one ZREM each) are their own, after the answer
        assert calls.get("evalsha", 0) - calls.get("zrem", 0) == 600, calls
        assert contracts.shared_classified == 601 and contracts.fail_open_classified == 0
        return out

    got = run(rs, body, envelope_burst=10**6 if envelope else None)
    assert [x.seq for x in got] == list(range(2, 602))
    times = [x.at for x in got]
    assert all(b >= a for a, b in itertools.pairwise(times))
    flags = [x.in_contract for x in got]
    # (the warm-up's request, 0.1 s before, left the envelope full again: 5 at 200/s refill in 25 ms)
    replay = classify(C, times, [5] * 600, [5] * 600).tolist()
    assert flags == replay
    assert 0 < sum(flags) < len(flags)


def scripts_called(url: str) -> int:
    """EVALSHA calls since the last ``CONFIG RESETSTAT``, checking that no other command was sent."""
    calls = redis_calls(url)
    assert set(calls) - {"evalsha"} <= IN_SCRIPTS | {"hmget", "pexpire"}, calls
    return calls.get("evalsha", 0)


def test_an_empty_envelope_is_classified_and_takes_no_lease(rs: RedisServer) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook, contracts: SharedContracts) -> None:
        leases = []
        for seq in (1, 2):  # the envelope's burst of 2, each with its lease
            got_class, charge, lease, asked = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
            assert got_class.in_contract and got_class.seq == seq and lease is not None and not asked
            leases.append(lease)
        reset_stats(rs.url)
        got_class, charge, lease, asked = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
        assert scripts_called(rs.url) == 1
        assert isinstance(charge, Deferral) and lease is None and not asked
        assert got_class.seq == 3 and not got_class.in_contract  # classified all the same (burst 2 spent)
        assert zcard(rs.url) == 2 and len(adm.live) == 2
        for lease in leases:
            adm.release(lease)

    run(rs, body, contract=SLOW, envelope_burst=2)


def test_a_full_limit_queues_by_class_and_the_queue_goes_first(rs: RedisServer) -> None:
    """Limit 1 held: the next request is classified (the second of the contract's burst of 2) and asked, no
    lease; while it waits in the queue, a third is classified alone (CONTRACT: excess) and not leased ahead
    of it."""

    async def body(adm: RedisAdmission, book: SharedEnvelopeBook, contracts: SharedContracts) -> None:
        _, _, first, _ = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
        assert first is not None
        got_class, _, lease, asked = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
        assert got_class.in_contract and lease is None and asked  # the second of the burst; no slot
        waiting = asyncio.ensure_future(adm.acquire(0, asked=True, in_contract=got_class.in_contract))
        await asyncio.sleep(0.2)
        assert not waiting.done() and adm.queue_depth(0) == 1
        reset_stats(rs.url)
        got_class, _, lease, asked = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
        assert not got_class.in_contract and got_class.seq == 3 and lease is None and not asked
        assert scripts_called(rs.url) == 1  # the class alone: the queued request goes first
        adm.release(first)
        second = await asyncio.wait_for(waiting, 10)
        assert isinstance(second, Lease) and zcard(rs.url) == 1
        adm.release(second)

    run(rs, body, contract=SLOW, limit=1)


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_a_broken_contract_key_fails_the_script_before_it_writes(rs: RedisServer, mode: str) -> None:
    """The contract key holding a string: closed answers 500 admission-error, open classifies on the mirror
    and leaves the lease to the caller; no lease and no envelope charge were taken in Redis; Redis stays up."""

    async def body(adm: RedisAdmission, book: SharedEnvelopeBook, contracts: SharedContracts) -> Any:
        with redis.Redis.from_url(rs.url) as r:
            r.set("admit:contract:a", "not a hash")
        try:
            got = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
        except AdmissionError as err:
            got = (err.status, err.reason)
        with redis.Redis.from_url(rs.url) as r:
            bucket = r.keys("admit:gcra:*")
        assert adm.up and adm.stats.script_errors_by.get("CONTRACT_ACQUIRE") == 1
        assert zcard(rs.url) == 0 and not adm.live and not bucket
        return got, contracts.fail_open_by

    got, fail_open = run(rs, body, contract=SLOW, mode=mode, envelope_burst=5)
    if mode == "closed":
        assert got == (500, ADMISSION_ERROR) and fail_open == [0]
    else:
        got_class, charge, lease, asked = got
        assert got_class.in_contract and got_class.seq is None and lease is None and not asked
        assert not isinstance(charge, SharedCharge) and fail_open == [1]  # the mirror's charge


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_redis_gone_follows_the_failure_mode(rs: RedisServer, mode: str) -> None:
    async def body(adm: RedisAdmission, book: SharedEnvelopeBook, contracts: SharedContracts) -> Any:
        await warm(adm, book, contracts)
        rs.kill()
        try:
            got: Any = await book.classify_and_acquire(0, "m", 10, contracts, 5, 5)
        except Deferred as d:
            got = (d.status, d.reason)
        assert not adm.up
        return got, adm.stats.fail_closed_deferred[0], contracts.fail_open_by

    got, deferred, fail_open = run(rs, body, contract=SLOW, mode=mode)
    if mode == "closed":
        assert got == (503, ADMISSION_UNAVAILABLE) and deferred == 1 and fail_open == [0]
    else:
        got_class, _, lease, asked = got
        assert got_class.in_contract and got_class.seq is None and lease is None and not asked
        assert fail_open == [1]

"""The in-process admission backend on a real event loop: cancellation races, TTL timer, sharing invariants."""

from __future__ import annotations

import asyncio
import random

import pytest
from admit.gateway.admission import Deferred, Lease
from admit.gateway.config import TenantConfig
from admit.gateway.local_admission import LocalAdmission


def tenants(*specs: tuple[int, int]) -> list[TenantConfig]:
    return [TenantConfig(name=f"t{i}", api_keys=(f"sk-key-{i:04d}",), limit=lim, borrow=b, max_queue=100,
                         queue_timeout_s=30) for i, (lim, b) in enumerate(specs)]


def test_a_slot_handed_to_a_waiter_that_just_left_goes_back() -> None:
    async def run() -> None:
        adm = LocalAdmission(tenants((1, 0)))
        first = await adm.acquire(0)
        waiter = asyncio.ensure_future(adm.acquire(0))
        await asyncio.sleep(0)  # the waiter is queued
        assert adm.queue_depth(0) == 1
        waiter.cancel()  # the client leaves ...
        adm.release(first)  # ... and in the same instant its slot frees and is handed to it
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert adm.in_flight(0) == 0 and adm.queue_depth(0) == 0
        again = await adm.acquire(0)  # the slot is usable
        adm.release(again)
        adm.release(again)  # releasing twice is harmless
        assert adm.in_flight(0) == 0

    asyncio.run(run())


def test_ttl_timer_defers_waiters_without_a_release() -> None:
    async def run() -> None:
        cfg = [TenantConfig(name="t", api_keys=("sk-key-0000",), limit=1, queue_timeout_s=0.05)]
        adm = LocalAdmission(cfg)
        held = await adm.acquire(0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(Deferred) as exc:
            await adm.acquire(0)
        assert exc.value.reason == "ttl-expired" and 0.04 <= loop.time() - t0 < 0.5
        adm.release(held)
        assert adm.snapshot()["tenants"]["t"]["ttl_expired"] == 1

    asyncio.run(run())


def test_sharing_never_passes_capacity_under_random_traffic() -> None:
    async def run() -> None:
        rng = random.Random(11)
        cap = 5
        adm = LocalAdmission(tenants((2, 3), (2, 0), (1, 4)), capacity=cap)
        held: list[Lease] = []
        waiting: list[asyncio.Future[Lease]] = []
        for _ in range(3000):
            op = rng.random()
            if op < 0.45:
                waiting.append(asyncio.ensure_future(adm.acquire(rng.randrange(3))))
            elif op < 0.8 and held:
                adm.release(held.pop(rng.randrange(len(held))))
            elif op < 0.9 and waiting:
                waiting.pop(rng.randrange(len(waiting))).cancel()
            else:
                adm.set_limit(rng.randrange(3), rng.randrange(4))
            await asyncio.sleep(0)
            still = []
            for f in waiting:
                if f.done():
                    if not f.cancelled() and f.exception() is None:
                        held.append(f.result())
                else:
                    still.append(f)
            waiting = still
            total = sum(adm.in_flight(i) for i in range(3))
            assert total == len(held) or any(f.done() for f in waiting)
            assert total <= cap
            free = cap - total
            # work-conserving: no tenant waits below its nominal limit while capacity is free
            for i in range(3):
                if adm.queue_depth(i) and free > 0:
                    assert adm.in_flight(i) >= adm.nominal[i] + adm.borrow[i]
        for f in waiting:
            f.cancel()
        await asyncio.sleep(0)
        for lease in held:
            adm.release(lease)
        assert sum(adm.in_flight(i) for i in range(3)) == 0

    asyncio.run(run())


def test_a_queue_wait_is_on_the_request_records_clock_under_uvloop() -> None:
    """The gateway times a request on ``time.monotonic`` (TTFT, the backend's part) and subtracts the queue wait
    to get its own part; so the wait must be on that clock too, bracketed by readings taken just before the
    request queued and just after it got its slot. uvloop's ``loop.time()`` counts whole milliseconds, and a
    wait read on it fell outside such brackets by up to a millisecond (CI saw a negative remainder)."""
    import time

    import uvloop

    async def run() -> list[str]:
        adm = LocalAdmission(tenants((1, 0)))
        misses = []
        for i in range(40):
            held = await adm.acquire(0)
            before = time.monotonic()
            waiter = asyncio.ensure_future(adm.acquire(0))
            await asyncio.sleep(0)  # queued now
            queued = time.monotonic()
            await asyncio.sleep(0.0003 * (i % 7))  # waits of a fraction of a millisecond and more
            released = time.monotonic()
            adm.release(held)
            lease = await waiter
            after = time.monotonic()
            # it queued after `before` and was handed its slot at the release, after `released` began
            if not (released - queued <= lease.waited_s <= after - before):
                misses.append(f"{lease.waited_s:.6f} not in [{released - queued:.6f}, {after - before:.6f}]")
            adm.release(lease)
        return misses

    assert uvloop.run(run()) == []


def test_a_tenant_never_holds_more_than_its_ceiling_borrowing_included() -> None:
    async def run() -> None:
        # a: limit 4, may borrow 3, ceiling 5 (Kueue: nominal 4, borrowing 1); the pool has room for 8
        cfg = [TenantConfig(name="a", api_keys=("sk-key-0000",), limit=4, borrow=3, min_limit=4, max_limit=5),
               TenantConfig(name="b", api_keys=("sk-key-0001",), limit=4)]
        adm = LocalAdmission(cfg, capacity=8)
        held = [await adm.acquire(0) for _ in range(5)]
        sixth = asyncio.ensure_future(adm.acquire(0))
        await asyncio.sleep(0)
        assert adm.in_flight(0) == 5 and adm.queue_depth(0) == 1  # 3 slots idle, but a is at its ceiling
        assert adm.snapshot()["tenants"]["a"]["effective_limit"] == 5
        adm.release(held.pop())
        held.append(await sixth)
        assert adm.in_flight(0) == 5
        for lease in held:
            adm.release(lease)

    asyncio.run(run())


def test_a_freed_slot_serves_a_guaranteed_share_before_a_limit_raised_above_its_floor() -> None:
    async def run() -> None:
        # a: floor 2, its limit raised to 4 (borrowed quota, by the control loop), higher priority; b: limit 2
        cfg = [TenantConfig(name="a", api_keys=("sk-key-0000",), limit=4, min_limit=2, priority=1),
               TenantConfig(name="b", api_keys=("sk-key-0001",), limit=2)]
        adm = LocalAdmission(cfg, capacity=4)
        held = [await adm.acquire(0) for _ in range(4)]
        b = asyncio.ensure_future(adm.acquire(1))
        a = asyncio.ensure_future(adm.acquire(0))
        await asyncio.sleep(0)
        assert adm.queue_depth(0) == adm.queue_depth(1) == 1
        adm.release(held.pop())  # a holds 3, above its floor: b, below its own, gets the slot despite priority
        await asyncio.sleep(0)
        assert b.done() and not a.done()
        adm.release(await b)
        held.append(await a)
        for lease in held:
            adm.release(lease)

    asyncio.run(run())

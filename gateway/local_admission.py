"""In-process admission backend: the shared `AdmissionCore` with futures as payloads, on the event loop.

Each request offers a future to the core. ADMITTED returns a lease at once, REJECTED defers with
``queue-full``; QUEUED awaits the future, which the gateway resolves when a released slot (or a raised
limit) dispatches it, or fails with ``ttl-expired`` when a timer calls ``expire()`` at ``next_deadline()``.
Every core call is synchronous on the loop thread, so decisions are atomic. A request out of its tenant's
contract (``acquire(..., in_contract=False)``) waits in the tenant's excess queue, which a freed slot serves
only when no in-contract request of the tenant waits (core/admission.py).

**Work-conserving sharing** (``capacity`` set): the core's per-tenant limit becomes the *effective* limit
that the gateway recomputes after every event, so that the backend never holds more than ``capacity``
requests. Each tenant is guaranteed its nominal limit; a tenant with ``borrow > 0`` may use up to that many
idle slots beyond it, and never more than its ``max_limit`` in all. A freed slot goes first to a waiting
tenant below its guaranteed share (its ``min_limit`` where it has one, else its whole limit), then to one
below its limit, then to a borrower, higher ``priority`` first and then the tenant with the lowest
in-flight/nominal ratio. So a limit the control loop raised above a Kueue floor (gateway/kueue.py) is
served after every tenant's nominal quota, as Kueue lends only quota its owner leaves idle. Nothing
running is preempted: a tenant that wants its guaranteed slots back gets the next ones that free up
(Kueue's borrowing without preemption). Without ``capacity`` the effective limit is the nominal one and
tenants are independent.

Times (queue deadlines, waits, leases) are on ``time.monotonic``, the clock of the gateway's request record,
not the event loop's: uvloop's ``loop.time()`` counts whole milliseconds, so a wait read on it could come out
longer than the TTFT it is part of, and the gateway's own share of that TTFT (``overhead_s``) negative.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

from admit.core.admission import AdmissionCore, Offer, QueueConfig
from admit.gateway.admission import Lease, TenantSlots
from admit.gateway.config import TenantConfig


class LocalAdmission(TenantSlots):
    def __init__(self, tenants: Sequence[TenantConfig], capacity: int | None = None) -> None:
        super().__init__(tenants)
        self._loop = asyncio.get_running_loop()
        self.borrow = [t.borrow for t in tenants]
        # a tenant's floor and ceiling (gateway/kueue.py): its guaranteed share, and the most it holds, borrowing
        # included; a tenant without them is guaranteed its whole limit and may hold limit + borrow
        self.floor = [t.min_limit for t in tenants]
        self.ceiling = [math.inf if t.max_limit is None else t.max_limit for t in tenants]
        self.capacity = capacity
        start = [0 if capacity is not None else t.limit for t in tenants]
        self.core = AdmissionCore(
            [QueueConfig(limit=s, max_queue=t.max_queue, queue_timeout_s=t.queue_timeout_s)
             for s, t in zip(start, tenants, strict=True)],
            time.monotonic,
        )
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._rebalancing = False
        if capacity is not None:
            self._rebalance()

    # ----------------------------------------------------------------- leases
    async def acquire(self, tenant: int, in_contract: bool = True) -> Lease:
        """A lease for one request of ``tenant``, at once or after a wait in its queue (``in_contract``: the
        in-contract queue, served first; else the excess one); raises Deferred when the queue is full or the
        wait times out."""
        fut: asyncio.Future[float] = self._loop.create_future()
        got = self.core.offer(tenant, fut, in_contract)
        if got is Offer.ADMITTED:
            if self.capacity is not None:
                self._rebalance()
            return Lease(tenant, time.monotonic(), 0.0)
        if got is Offer.REJECTED:
            raise self._full(tenant)
        if self.capacity is not None:
            self._rebalance()
        self._arm_timer()
        try:
            waited = await fut
        except asyncio.CancelledError:
            if fut.cancelled():  # still queued (or handed a slot that _deliver already gave back)
                if self.core.cancel(tenant, fut):
                    self.cancelled[tenant] += 1
            elif fut.exception() is None:  # a slot arrived just as the client left: give it back
                self.release(Lease(tenant, time.monotonic(), fut.result()))
            raise
        return Lease(tenant, time.monotonic(), waited)

    def release(self, lease: Lease) -> None:
        if not self._first_release(lease, time.monotonic()):
            return
        self._free_slot(lease.tenant)
        if self.capacity is not None and not self._rebalancing:
            self._rebalance()
        if self.core.next_deadline() == -math.inf:
            self._arm_timer()

    def _free_slot(self, t: int) -> None:
        if self.capacity is None:
            got = self.core.release(t)
            if got is not None:
                self._deliver(t, *got)
        else:
            self.core.set_limit(t, self.core.in_flight(t) - 1)  # the freed slot is the rebalancer's to give
            self.core.release(t)

    def _deliver(self, tenant: int, fut: Any, waited: float) -> None:
        if fut.done():  # its client left between dispatch and now: the slot goes straight back
            self._free_slot(tenant)
        else:
            fut.set_result(waited)

    # ----------------------------------------------------------------- limits
    def set_limit(self, tenant: int, limit: int) -> int:
        old = self._set_nominal(tenant, limit)
        if self.capacity is None:
            for fut, waited in self.core.set_limit(tenant, self.nominal[tenant]):
                self._deliver(tenant, fut, waited)
        else:
            self._rebalance()
        self._arm_timer()
        return old

    def set_borrow(self, tenant: int, borrow: int) -> int:
        if borrow < 0:
            raise ValueError(f"borrow must be >= 0, got {borrow}")
        if self.capacity is None and borrow:
            raise ValueError("borrowing needs a global capacity")
        old, self.borrow[tenant] = self.borrow[tenant], int(borrow)
        if self.capacity is not None:
            self._rebalance()
        return old

    def _rebalance(self) -> None:
        """Give free capacity to waiting tenants, then set every effective limit to in-flight + headroom."""
        core = self.core
        assert self.capacity is not None
        n = self.n_tenants
        self._rebalancing = True
        try:
            while (free := self.capacity - sum(core.in_flight(i) for i in range(n))) > 0:
                best, key = -1, (0, 0, 0.0)
                for i in range(n):
                    if not core.queue_depth(i):
                        continue
                    f = core.in_flight(i)
                    nom = self.nominal[i]
                    floor = nom if (lo := self.floor[i]) is None else min(nom, lo)
                    cls = 0 if f < floor else 1 if f < nom else 2 if f < self._top(i) else 3
                    if cls == 3:
                        continue
                    k = (cls, -self.priority[i], f / max(nom, 1))
                    if best < 0 or k < key:
                        best, key = i, k
                if best < 0:
                    break
                # expired heads are skipped by the core (handed out by the next expire()); loop with what is left
                for fut, waited in core.set_limit(best, core.in_flight(best) + 1):
                    self._deliver(best, fut, waited)
            free = self.capacity - sum(core.in_flight(i) for i in range(n))
            for i in range(n):
                f = core.in_flight(i)
                headroom = max(0, min(self._top(i) - f, free))
                if core.limit(i) != f + headroom:
                    core.set_limit(i, f + headroom)  # no queue here, or no headroom: dispatches nothing
        finally:
            self._rebalancing = False

    def _top(self, i: int) -> int:
        """The most tenant ``i`` may hold in the pool: its limit plus what it may borrow, at most its ceiling."""
        return int(min(self.nominal[i] + self.borrow[i], self.ceiling[i]))

    # ----------------------------------------------------------------- queue timeouts
    def _arm_timer(self) -> None:
        due = self.core.next_deadline()
        if due == math.inf or due >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = due
        self._timer = self._loop.call_later(max(0.0, due - time.monotonic()) + 0.001, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        for tenant, fut, _waited in self.core.expire():
            deferred = self._expired(tenant)
            if not fut.done():
                fut.set_exception(deferred)
        self._arm_timer()

    # ----------------------------------------------------------------- state
    def _queue_len(self, tenant: int) -> int:
        return self.core.queue_depth(tenant)

    def in_flight(self, tenant: int) -> int:
        return self.core.in_flight(tenant)

    def queue_depth(self, tenant: int) -> int:
        return self.core.queue_depth(tenant)

    def snapshot(self) -> dict[str, Any]:
        tenants = {}
        for i, name in enumerate(self.names):
            c = self.core.counters(i)
            tenants[name] = {
                "limit": self.nominal[i],
                "effective_limit": self.core.limit(i),
                "borrow": self.borrow[i],
                "priority": self.priority[i],
                "in_flight": self.core.in_flight(i),
                "queue_depth": self.core.queue_depth(i),
                "max_queue": self.max_queue[i],
                "queue_timeout_s": self.ttl[i],
                "admitted": c["admitted"],
                "queue_full": self.queue_full[i],
                "ttl_expired": self.ttl_expired[i],
                "cancelled_in_queue": self.cancelled[i],
            }
        return {
            "capacity": self.capacity,
            "in_flight": sum(self.core.in_flight(i) for i in range(self.n_tenants)),
            "tenants": tenants,
        }

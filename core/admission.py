"""The admission core: per-tenant FIFO queues in front of a shared server, in-contract requests first.

One piece of code for both worlds. The simulator drives it in simulated time, the live gateway in
wall-clock time; the time source is injected as a zero-argument callable (`clock`) and nothing in here
reads a global clock, sleeps, or imports simulator or web code.

Per tenant the core holds
* a concurrency ``limit`` that may be changed at any time (raising it dispatches queued work at once,
  lowering it never cancels work already in flight: it takes effect as requests finish),
* the number of requests ``in_flight`` (admitted and not yet released),
* two FIFO queues, one for the requests in the tenant's contract and one for its excess (core/contract.py
  decides which a request is, at its arrival; ``offer(..., in_contract=)``). A freed slot goes to the oldest
  in-contract item, and to the oldest excess item only when no in-contract one waits, so a tenant's excess
  never delays its own promised requests; it never reorders tenants, each has its own slots. A tenant without
  a contract offers everything as in contract and so has one FIFO queue,
* one bound on both queues together (``max_queue``); an offer that finds them full is rejected,
* a queue timeout: an item that has waited longer than ``queue_timeout_s`` is dropped by ``expire()``, in
  either queue.

All operations are synchronous and non-blocking, so "check then increment" happens inside one call and
cannot overshoot a limit. Payloads are opaque: the simulator queues request objects, the gateway futures.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from enum import IntEnum
from typing import Any

from admit.core.schema import StrictModel, Unbounded
from pydantic import Field

Clock = Callable[[], float]


class Offer(IntEnum):
    """What happened to an offered item."""

    ADMITTED = 0  # a slot was free: the caller dispatches the item now
    QUEUED = 1  # waiting in one of the tenant's FIFO queues
    REJECTED = 2  # the tenant's queues were full: the caller defers the request (e.g. HTTP 429)


class QueueConfig(StrictModel):
    """Admission settings of one tenant; ``queue_timeout_s`` may be ``math.inf``, no timeout."""

    limit: int = Field(ge=0)
    max_queue: int = Field(ge=0)
    queue_timeout_s: Unbounded = Field(gt=0)


class _TenantState:
    __slots__ = ("admitted", "dropped", "excess", "in_flight", "limit", "max_queue", "queue", "rejected", "timeout")

    def __init__(self, cfg: QueueConfig) -> None:
        self.limit = cfg.limit
        self.max_queue = cfg.max_queue
        self.timeout = cfg.queue_timeout_s
        self.in_flight = 0
        # (deadline, enqueued_at, payload): the in-contract items, then the excess; deadlines are increasing in
        # each because the timeout is per tenant, so each queue's head is its next to time out
        self.queue: deque[tuple[float, float, Any]] = deque()
        self.excess: deque[tuple[float, float, Any]] = deque()
        self.admitted = 0
        self.rejected = 0
        self.dropped = 0


class AdmissionCore:
    """Per-tenant concurrency limits with bounded FIFO queues (in contract, then excess) and a queue timeout.

    Tenants are addressed by index ``0..n-1`` (the order of ``configs``).
    """

    def __init__(self, configs: Iterable[QueueConfig], clock: Clock) -> None:
        self._t = [_TenantState(c) for c in configs]
        if not self._t:
            raise ValueError("AdmissionCore needs at least one tenant")
        self._clock = clock
        self._late: list[tuple[int, Any, float]] = []  # found expired while dispatching, not yet reported
        self.queued = 0  # items in all queues together

    # ----------------------------------------------------------------- inspection
    @property
    def n_tenants(self) -> int:
        return len(self._t)

    def limit(self, tenant: int) -> int:
        return self._t[tenant].limit

    def in_flight(self, tenant: int) -> int:
        return self._t[tenant].in_flight

    def queue_depth(self, tenant: int) -> int:
        """Items in the tenant's queues, both classes."""
        s = self._t[tenant]
        return len(s.queue) + len(s.excess)

    def counters(self, tenant: int) -> dict[str, int]:
        s = self._t[tenant]
        return {"admitted": s.admitted, "rejected": s.rejected, "dropped": s.dropped}

    def next_deadline(self) -> float:
        """Earliest time at which a queued item times out (``math.inf`` when all queues are empty)."""
        if self._late:
            return -math.inf
        best = math.inf
        if not self.queued:
            return best
        for s in self._t:
            if s.queue and s.queue[0][0] < best:
                best = s.queue[0][0]
            if s.excess and s.excess[0][0] < best:
                best = s.excess[0][0]
        return best

    # ----------------------------------------------------------------- operations
    def offer(self, tenant: int, payload: Any, in_contract: bool = True) -> Offer:
        """Offer one request of ``tenant``: admit it, queue it (``in_contract``: in the in-contract queue, else
        in the excess one), or reject it when the tenant's queues hold ``max_queue`` items together."""
        s = self._t[tenant]
        if s.in_flight < s.limit and not s.queue and not s.excess:
            s.in_flight += 1
            s.admitted += 1
            return Offer.ADMITTED
        if len(s.queue) + len(s.excess) >= s.max_queue:
            s.rejected += 1
            return Offer.REJECTED
        now = self._clock()
        (s.queue if in_contract else s.excess).append((now + s.timeout, now, payload))
        self.queued += 1
        return Offer.QUEUED

    def release(self, tenant: int) -> tuple[Any, float] | None:
        """A request of ``tenant`` finished (or was cancelled): free its slot.

        Returns ``(payload, waited_s)`` of the queued item that takes the freed slot, or None. The caller
        must dispatch the returned payload. Queued items found already past their deadline are not
        dispatched; they are handed out by the next ``expire()`` (``next_deadline()`` says "now").
        """
        s = self._t[tenant]
        if s.in_flight <= 0:
            raise RuntimeError(f"release() for tenant {tenant} with nothing in flight")
        s.in_flight -= 1
        if (s.queue or s.excess) and s.in_flight < s.limit:
            return self._dispatch_one(tenant, s, self._clock())
        return None

    def _dispatch_one(self, tenant: int, s: _TenantState, now: float) -> tuple[Any, float] | None:
        """The oldest in-contract item still within its deadline, else the oldest such excess item, or None."""
        for q in (s.queue, s.excess):
            while q:
                deadline, enq, payload = q.popleft()
                self.queued -= 1
                if deadline < now:  # waited too long: it is a drop, not a dispatch
                    s.dropped += 1
                    self._late.append((tenant, payload, now - enq))
                    continue
                s.in_flight += 1
                s.admitted += 1
                return payload, now - enq
        return None

    def take(self, tenant: int) -> tuple[Any, float] | None:
        """Dispatch the tenant's next queued item on a slot granted outside this core (a backend that keeps the
        slots elsewhere and uses the core for its queues only, with a limit of 0: gateway/redis/admission.py):
        ``(payload, waited_s)`` of the oldest in-contract item within its deadline, else of the oldest such
        excess one, or None. Counted as admitted, not in flight (the slot is not this core's)."""
        s = self._t[tenant]
        got = self._dispatch_one(tenant, s, self._clock())
        if got is not None:
            s.in_flight -= 1
        return got

    def set_limit(self, tenant: int, limit: int) -> list[tuple[Any, float]]:
        """Change a tenant's limit; returns the queued items dispatched because of a raise."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        s = self._t[tenant]
        s.limit = int(limit)
        out: list[tuple[Any, float]] = []
        if (s.queue or s.excess) and s.in_flight < s.limit:
            now = self._clock()
            while s.in_flight < s.limit:
                got = self._dispatch_one(tenant, s, now)
                if got is None:
                    break
                out.append(got)
        return out

    def expire(self) -> list[tuple[int, Any, float]]:
        """Drop every queued item whose deadline has passed; returns ``(tenant, payload, waited_s)``: the items
        found late by a dispatch, then per tenant its in-contract items and then its excess, oldest first.

        Dropping frees no slot (a queued item holds none), so nothing is dispatched here.
        """
        now = self._clock()
        out, self._late = self._late, []
        for i, s in enumerate(self._t):
            for q in (s.queue, s.excess):
                while q and q[0][0] <= now:
                    _, enq, payload = q.popleft()
                    self.queued -= 1
                    s.dropped += 1
                    out.append((i, payload, now - enq))
        return out

    def cancel(self, tenant: int, payload: Any) -> bool:
        """Remove a still-queued payload, of either class (its client went away). True if it was found."""
        s = self._t[tenant]
        for q in (s.queue, s.excess):
            for idx, item in enumerate(q):
                if item[2] is payload:
                    del q[idx]
                    self.queued -= 1
                    return True
        return False

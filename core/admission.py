"""The admission core: per-tenant FIFO queues in front of a shared server.

One piece of code for both worlds. The simulator drives it in simulated time, the live gateway in
wall-clock time; the time source is injected as a zero-argument callable (`clock`) and nothing in here
reads a global clock, sleeps, or imports simulator or web code.

Per tenant the core holds
* a concurrency ``limit`` that may be changed at any time (raising it dispatches queued work at once,
  lowering it never cancels work already in flight: it takes effect as requests finish),
* the number of requests ``in_flight`` (admitted and not yet released),
* a bounded FIFO queue (``max_queue``); an offer to a full queue is rejected,
* a queue timeout: an item that has waited longer than ``queue_timeout_s`` is dropped by ``expire()``.

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
    QUEUED = 1  # waiting in the tenant's FIFO queue
    REJECTED = 2  # the tenant's queue was full: the caller defers the request (e.g. HTTP 429)


class QueueConfig(StrictModel):
    """Admission settings of one tenant; ``queue_timeout_s`` may be ``math.inf``, no timeout."""

    limit: int = Field(ge=0)
    max_queue: int = Field(ge=0)
    queue_timeout_s: Unbounded = Field(gt=0)


class _TenantState:
    __slots__ = ("admitted", "dropped", "in_flight", "limit", "max_queue", "queue", "rejected", "timeout")

    def __init__(self, cfg: QueueConfig) -> None:
        self.limit = cfg.limit
        self.max_queue = cfg.max_queue
        self.timeout = cfg.queue_timeout_s
        self.in_flight = 0
        # (deadline, enqueued_at, payload); deadlines are increasing because the timeout is per tenant
        self.queue: deque[tuple[float, float, Any]] = deque()
        self.admitted = 0
        self.rejected = 0
        self.dropped = 0


class AdmissionCore:
    """Per-tenant concurrency limits with bounded FIFO queues and a queue timeout.

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
        return len(self._t[tenant].queue)

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
        return best

    # ----------------------------------------------------------------- operations
    def offer(self, tenant: int, payload: Any) -> Offer:
        """Offer one request of ``tenant``: admit it, queue it, or reject it when the queue is full."""
        s = self._t[tenant]
        if s.in_flight < s.limit and not s.queue:
            s.in_flight += 1
            s.admitted += 1
            return Offer.ADMITTED
        if len(s.queue) >= s.max_queue:
            s.rejected += 1
            return Offer.REJECTED
        now = self._clock()
        s.queue.append((now + s.timeout, now, payload))
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
        if s.queue and s.in_flight < s.limit:
            return self._dispatch_one(tenant, s, self._clock())
        return None

    def _dispatch_one(self, tenant: int, s: _TenantState, now: float) -> tuple[Any, float] | None:
        q = s.queue
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

    def set_limit(self, tenant: int, limit: int) -> list[tuple[Any, float]]:
        """Change a tenant's limit; returns the queued items dispatched because of a raise."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        s = self._t[tenant]
        s.limit = int(limit)
        out: list[tuple[Any, float]] = []
        if s.queue and s.in_flight < s.limit:
            now = self._clock()
            while s.in_flight < s.limit:
                got = self._dispatch_one(tenant, s, now)
                if got is None:
                    break
                out.append(got)
        return out

    def expire(self) -> list[tuple[int, Any, float]]:
        """Drop every queued item whose deadline has passed; returns ``(tenant, payload, waited_s)``.

        Dropping frees no slot (a queued item holds none), so nothing is dispatched here.
        """
        now = self._clock()
        out, self._late = self._late, []
        for i, s in enumerate(self._t):
            q = s.queue
            while q and q[0][0] <= now:
                _, enq, payload = q.popleft()
                self.queued -= 1
                s.dropped += 1
                out.append((i, payload, now - enq))
        return out

    def cancel(self, tenant: int, payload: Any) -> bool:
        """Remove a still-queued payload (its client went away). True if it was found."""
        q = self._t[tenant].queue
        for idx, item in enumerate(q):
            if item[2] is payload:
                del q[idx]
                self.queued -= 1
                return True
        return False

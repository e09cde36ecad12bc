"""The admission-backend interface of the gateway: what any backend (in-process now, Redis later) provides.

A backend hands out concurrency *leases*: ``await acquire(tenant)`` returns a `Lease` when the request may
go to the backend (at once or after waiting in the tenant's FIFO queue) or raises `Deferred` with a
machine-readable reason and a retry-after estimate; ``release(lease)`` gives the slot back exactly once.
Limits are changed through ``set_limit`` at any time (the admin API and the control loop call it).
Cancellation of the awaiting task (the client went away) must leave no slot behind.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from admit.gateway.config import TenantConfig

# deferral reasons (the x-admit-reason header and the JSON body's "reason")
QUEUE_FULL = "queue-full"
TTL_EXPIRED = "ttl-expired"
ENVELOPE_EMPTY = "envelope-empty"
ADMISSION_UNAVAILABLE = "admission-unavailable"  # the shared state (Redis) is unreachable and we fail closed
REASONS = (QUEUE_FULL, TTL_EXPIRED, ENVELOPE_EMPTY, ADMISSION_UNAVAILABLE)


class Deferred(Exception):
    """The request is deferred: answer ``status`` (429, or 503 when admission itself is unavailable)."""

    def __init__(self, reason: str, retry_after_s: float, detail: str = "", status: int = 429) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.detail = detail
        self.status = status


@dataclass(slots=True)
class Lease:
    tenant: int
    granted_at: float
    waited_s: float
    released: bool = False


class AdmissionBackend(Protocol):
    n_tenants: int

    async def acquire(self, tenant: int) -> Lease: ...

    def release(self, lease: Lease) -> None: ...

    def set_limit(self, tenant: int, limit: int) -> int:
        """Set the tenant's (nominal) limit; returns the previous one."""
        ...

    def limit(self, tenant: int) -> int: ...

    def snapshot(self) -> dict[str, Any]:
        """Per-tenant state for the admin API and metrics: limits, in flight, queue depth, counters."""
        ...


_EMA = 0.2  # weight of one hold time in the per-tenant mean used for Retry-After estimates


class TenantSlots:
    """What every backend keeps per tenant, written once: the nominal limit and how it is set, the queue
    settings, the deferral counters, the mean hold time and the Retry-After estimate built from it.

    A backend subclasses it, calls ``_set_nominal`` from its own ``set_limit`` (which then dispatches,
    rebalances or publishes the new value as that backend needs) and provides ``_queue_len``.
    """

    def __init__(self, tenants: Sequence[TenantConfig]) -> None:
        self.names = [t.name for t in tenants]
        self.n_tenants = len(tenants)
        self.nominal = [t.limit for t in tenants]
        self.priority = [t.priority for t in tenants]
        self.ttl = [t.queue_timeout_s for t in tenants]
        self.max_queue = [t.max_queue for t in tenants]
        self.hold_s = [1.0] * self.n_tenants
        self.queue_full = [0] * self.n_tenants
        self.ttl_expired = [0] * self.n_tenants
        self.cancelled = [0] * self.n_tenants

    def limit(self, tenant: int) -> int:
        return self.nominal[tenant]

    def _set_nominal(self, tenant: int, limit: int) -> int:
        """Check and store a new nominal limit; returns the previous one."""
        try:
            value = operator.index(limit)  # an int (numpy's too), never a float silently truncated
        except TypeError:
            value = -1
        if isinstance(limit, bool) or value < 0:
            raise ValueError(f"limit must be an integer >= 0, got {limit!r}")
        old, self.nominal[tenant] = self.nominal[tenant], value
        return old

    def _held(self, tenant: int, seconds: float) -> None:
        self.hold_s[tenant] += _EMA * (seconds - self.hold_s[tenant])

    def _first_release(self, lease: Lease, now: float) -> bool:
        """Mark a lease released and count its hold time; False when it was released already (a second
        release of the same lease must free nothing)."""
        if lease.released:
            return False
        lease.released = True
        self._held(lease.tenant, now - lease.granted_at)
        return True

    def _queue_len(self, tenant: int) -> int:
        raise NotImplementedError

    def retry_estimate(self, tenant: int) -> float:
        """Seconds until a slot is likely free: mean hold time x (queue + 1) / limit, within [1 s, TTL]."""
        lim = max(1, self.nominal[tenant])
        est = self.hold_s[tenant] * (self._queue_len(tenant) + 1) / lim
        return min(max(1.0, est), max(1.0, self.ttl[tenant]))

    def _full(self, tenant: int) -> Deferred:
        self.queue_full[tenant] += 1
        return Deferred(QUEUE_FULL, self.retry_estimate(tenant), f"queue of {self.max_queue[tenant]} is full")

    def _expired(self, tenant: int) -> Deferred:
        self.ttl_expired[tenant] += 1
        return Deferred(TTL_EXPIRED, self.retry_estimate(tenant), f"waited longer than {self.ttl[tenant]:g} s")

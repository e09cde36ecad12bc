"""The admission-backend interface of the gateway: what any backend (in-process now, Redis later) provides.

A backend hands out concurrency *leases*: ``await acquire(tenant)`` returns a `Lease` when the request may
go to the backend (at once or after waiting in the tenant's FIFO queue) or raises `Deferred` with a
machine-readable reason and a retry-after estimate; ``release(lease)`` gives the slot back exactly once.
Limits are changed through ``set_limit`` at any time; the admin API (and the control loop through it) calls
``write_limits``, a compare-and-set that numbers each change (``version``, ``versions``: below). Cancellation
of the awaiting task (the client went away) must leave no slot behind.

**Versions.** Every change made through the admin API gets the next *configuration version* (a batch of
limits is one change, one version), and every tenant it touches the next version of that tenant's own
sequence. In process they are counted here (and kept in the state file, gateway/state.py); with Redis they
are counted in Redis by the script that makes the change, one sequence for all replicas, and a replica takes
a value read from Redis only when its tenant version is at least the one the replica knows, so a read that
was on its way while a newer write landed never undoes it (gateway/redis/admission.py).
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


class WriteFailed(Exception):
    """An admin change that could not be stored where it must be (Redis): nothing was applied on this replica.
    The admin API answers ``status`` with ``reason`` and ``detail``."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Change:
    """One tenant's value changed by an admin call: what it was (None: nothing was stored), what it is, and the
    tenant version the change got."""

    tenant: int
    old: Any
    new: Any
    tenant_version: int


@dataclass(frozen=True, slots=True)
class Written:
    """What an admin write did: the configuration version after it (the change's own when ``changes`` is not
    empty) and the values it changed; none when every value was already in force."""

    version: int
    changes: list[Change]


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
    version: int  # the configuration version (module docstring)
    versions: list[int]  # per tenant: that tenant's version

    async def acquire(self, tenant: int, *, in_contract: bool = True) -> Lease: ...

    def release(self, lease: Lease) -> None: ...

    def set_limit(self, tenant: int, limit: int) -> int:
        """Set the tenant's (nominal) limit; returns the previous one."""
        ...

    def limit(self, tenant: int) -> int: ...

    async def write_limits(self, limits: Sequence[tuple[int, int]]) -> Written:
        """Set ``(tenant, limit)`` pairs as one change: compare each with the limit in force (in Redis, with
        Redis's) and set those that differ under one new configuration version; raises WriteFailed when the
        change cannot be stored."""
        ...

    def next_version(self, tenants: Sequence[int]) -> int:
        """A change made in process (borrow, envelopes without Redis): the next configuration version, and the
        next version of each of ``tenants``."""
        ...

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
        self.version = 0
        self.versions = [0] * self.n_tenants

    def limit(self, tenant: int) -> int:
        return self.nominal[tenant]

    def set_limit(self, tenant: int, limit: int) -> int:
        raise NotImplementedError

    def next_version(self, tenants: Sequence[int]) -> int:
        self.version += 1
        for t in tenants:
            self.versions[t] += 1
        return self.version

    async def write_limits(self, limits: Sequence[tuple[int, int]]) -> Written:
        """In process: compared with the nominal limits, set at once (nothing awaits in between)."""
        changed = [(t, v) for t, v in limits if self.nominal[t] != v]
        if not changed:
            return Written(self.version, [])
        version = self.next_version([t for t, _ in changed])
        return Written(version, [Change(t, self.set_limit(t, v), v, self.versions[t]) for t, v in changed])

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

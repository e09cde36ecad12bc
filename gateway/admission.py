"""The admission-backend interface of the gateway: what any backend (in-process now, Redis later) provides.

A backend hands out concurrency *leases*: ``await acquire(tenant)`` returns a `Lease` when the request may
go to the backend (at once or after waiting in the tenant's FIFO queue) or raises `Deferred` with a
machine-readable reason and a retry-after estimate; ``release(lease)`` gives the slot back exactly once.
Limits are changed through ``set_limit`` at any time (the admin API and the control loop call it).
Cancellation of the awaiting task (the client went away) must leave no slot behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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

"""Tenant and control specifications shared by the simulator, the controllers and the live gateway."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from admit.core.contract import Contract


@dataclass(frozen=True)
class TenantSpec:
    """One tenant as a controller sees it: a name and its service-level objectives.

    SLOs are upper bounds in seconds on latency percentiles over the window (``slo_*_p99_s``) and on each
    request (``slo_ttft_s``, ``slo_tpot_s``, ``slo_e2e_s``; core/slo.py); ``math.inf`` means "no objective".
    """

    name: str
    slo_e2e_p99_s: float = math.inf
    slo_ttft_p99_s: float = math.inf
    weight: float = 1.0
    priority: int = 0
    # per-request objectives (core/slo.py): a request is good when it meets all three
    slo_ttft_s: float = math.inf
    slo_tpot_s: float = math.inf
    slo_e2e_s: float = math.inf
    # a ceiling on this tenant's limit below ``Limits.max`` (what Kueue admitted for it, gateway/kueue.py);
    # None: none but Limits.max
    max_limit: int | None = None
    # the load it is promised service for (core/contract.py); None: no promise
    contract: Contract | None = None
    # that contract as a share of the engine's estimated capacity (envs/family.py's contract_loads), where the
    # world knows its engine (a scenario); None live or without a contract
    contract_load: float | None = None
    # a floor on this tenant's limit above ``Limits.min``: a guaranteed share no decision takes away (Kueue's
    # nominalQuota, gateway/kueue.py); None: none but Limits.min
    min_limit: int | None = None

    @property
    def request_bounds(self) -> tuple[float, float, float]:
        """(ttft, tpot, e2e) per-request bounds, ``inf`` for none: what ``core.slo.is_good`` takes."""
        return (self.slo_ttft_s, self.slo_tpot_s, self.slo_e2e_s)


@dataclass(frozen=True)
class Limits:
    """Bounds on every tenant's concurrency limit and on one decision's change."""

    min: int = 1
    max: int = 16
    initial: int = 4
    max_step: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max:
            raise ValueError(f"limits need 0 <= min <= max, got min={self.min} max={self.max}")
        if not self.min <= self.initial <= self.max:
            raise ValueError(f"initial limit {self.initial} is outside [min={self.min}, max={self.max}]")
        if self.max_step < 1:
            raise ValueError(f"max_step must be >= 1, got {self.max_step}")

    def clamp(self, value: int) -> int:
        return self.min if value < self.min else self.max if value > self.max else value

    def apply(self, current: Sequence[int], deltas: Sequence[int]) -> list[int]:
        """The new limits of one decision: each current limit plus its delta, clamped to [min, max].

        The one place a decision's deltas become limits, so the simulator and the live control loop cannot
        disagree on it. ``deltas`` are taken as given (``validate_deltas`` checks them against ``max_step``).
        """
        return [self.clamp(int(c) + int(d)) for c, d in zip(current, deltas, strict=True)]


@dataclass(frozen=True)
class ControlSpec:
    """What a controller is told at ``reset``: the tenants, the limit bounds and the decision interval."""

    tenants: tuple[TenantSpec, ...]
    limits: Limits = field(default_factory=Limits)
    interval_s: float = 3.0
    window_s: float = 6.0
    queue_timeout_s: float = math.inf

    @property
    def n_tenants(self) -> int:
        return len(self.tenants)

    def apply(self, current: Sequence[int], deltas: Sequence[int]) -> list[int]:
        """`Limits.apply`, then each tenant's own ceiling (``TenantSpec.max_limit``) and floor
        (``TenantSpec.min_limit``) where it has them; the floor wins over ``Limits.max``, a guaranteed share
        being the tenant's whatever the global bounds (a configuration keeps floor <= ceiling)."""
        after = self.limits.apply(current, deltas)
        out = []
        for a, t in zip(after, self.tenants, strict=True):
            if t.max_limit is not None:
                a = min(a, t.max_limit)
            if t.min_limit is not None:
                a = max(a, t.min_limit)
            out.append(a)
        return out

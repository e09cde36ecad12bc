"""AIMD (Netflix concurrency-limits ``AIMDLimit``), one instance per tenant.

Per tenant, once per decision (one windowed sample, as Netflix's WindowedLimit feeds it)::

    drop in the window            →  L = ⌊0.9 · L⌋          (multiplicative decrease, backoffRatio 0.9)
    else if 2 · in_flight ≥ L      →  L = L + 1              (additive increase, only when the limit is used)
    L = clamp(L, min, max)

A "drop" is what the reference's implications list: queue-timeout drops and queue-full rejections of the
window, and an SLO miss (the window's TTFT or e2e p99 over the tenant's objective) standing in for Netflix's
"rtt > timeout". Source: Netflix/concurrency-limits, ``limit/AIMDLimit.java`` (defaults: backoff 0.9,
timeout 5 s); here bounds and initial limit come from the scenario.
Latency input: only through the SLO miss (window p99 of TTFT and/or e2e, whichever objectives exist).
"""

from __future__ import annotations

import math

from admit.controllers.common import slo_missed, to_delta
from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class AIMDController:
    name = "aimd"

    def __init__(self, backoff: float = 0.9) -> None:
        if not 0.5 <= backoff < 1.0:
            raise ValueError(f"backoff must be in [0.5, 1), got {backoff}")
        self.backoff = backoff
        self.L: list[float] = []

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.lim = spec.limits
        self.L = [float(spec.limits.initial)] * spec.n_tenants

    def act(self, obs: Observation) -> list[int]:
        out = []
        for i, t in enumerate(obs.tenants):
            L = self.L[i]
            if t.drops + t.rejections > 0 or slo_missed(t):
                L = math.floor(self.backoff * L)
            elif 2 * t.in_flight >= L:
                L += 1
            self.L[i] = L = float(min(self.lim.max, max(self.lim.min, L)))
            out.append(to_delta(L, t.limit, self.lim.max_step))
        return out

"""Static caps, Kueue-style: every tenant's concurrency limit is fixed at deploy time.

With no argument the limits stay at the scenario's initial value. ``StaticController(cap=c)`` walks each
limit to ``c`` (at most ``max_step`` per decision) and keeps it there; per-tenant caps are given as a list.
"""

from __future__ import annotations

from collections.abc import Sequence

from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class StaticController:
    name = "static"

    def __init__(self, cap: int | Sequence[int] | None = None) -> None:
        self.cap = cap
        self._targets: list[int] | None = None
        self._k = 1

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self._k = spec.limits.max_step
        if self.cap is None:
            self._targets = None
            return
        caps = [self.cap] * spec.n_tenants if isinstance(self.cap, int) else list(self.cap)
        if len(caps) != spec.n_tenants:
            raise ValueError(f"static caps: expected {spec.n_tenants} values (one per tenant), got {len(caps)}")
        self._targets = [spec.limits.clamp(int(c)) for c in caps]

    def decision_rule(self) -> tuple[str, tuple[float, ...]] | None:
        """core.controller.decision_rule: static caps at the targets set by ``reset`` (unless ``act`` is overridden)."""
        if type(self).act is not StaticController.act:
            return None
        return "static", tuple(float(t) for t in self._targets) if self._targets is not None else ()

    def act(self, obs: Observation) -> list[int]:
        if self._targets is None:
            return [0] * obs.n_tenants
        k = self._k
        return [max(-k, min(k, int(tgt - t.limit))) for tgt, t in zip(self._targets, obs.tenants, strict=True)]

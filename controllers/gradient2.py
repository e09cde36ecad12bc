"""Gradient2 (Netflix concurrency-limits ``Gradient2Limit``), one instance per tenant.

Per tenant, once per decision, with short = this window's median latency and long = an exponential moving
average of it over ~600 samples (α = 2/601 per request; a window of n new completions counts as
n samples, α_eff = 1 − (1 − α)^n; the first 10 samples are a plain average)::

    if long / short > 2:   long = 0.95 · long                       (let the baseline recover after a jam)
    if in_flight < L / 2:  hold                                    (app-limited: latency says nothing)
    g = clamp(1.5 · long / short, 0.5, 1)                         (rttTolerance 1.5)
    L = 0.8 · L + 0.2 · (L · g + 4)                                (smoothing 0.2, queue 4)
    L = clamp(L, min, max)

Gradient2 ignores drops, as the original does. Source: Netflix/concurrency-limits,
``limit/Gradient2Limit.java`` and ``measurement/ExpAvgMeasurement.java``.
Latency input (controllers/common.py): window TTFT p50 on the token engine; e2e p50 on the slot engine.
The window medians stand in for the original's average RTT (the Observation has percentiles only); new
samples per window = completions × interval / window, since consecutive windows overlap.
"""

from __future__ import annotations

from admit.controllers.common import latency, latency_kind, to_delta
from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class Gradient2Controller:
    name = "gradient2"

    def __init__(self, long_window: int = 600, tolerance: float = 1.5, smoothing: float = 0.2, queue: float = 4.0):
        self.alpha = 2.0 / (long_window + 1)
        self.tolerance, self.smoothing, self.queue = tolerance, smoothing, queue

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.lim = spec.limits
        self.kind = latency_kind(spec)
        self.fresh = min(1.0, spec.interval_s / spec.window_s) if spec.window_s > 0 else 1.0
        n = spec.n_tenants
        self.L = [float(spec.limits.initial)] * n
        self.long = [0.0] * n
        self.count = [0.0] * n

    def _update_long(self, i: int, short: float, n_new: float) -> float:
        if self.count[i] < 10:  # warm-up: plain average of the first samples
            c = self.count[i] + n_new
            self.long[i] = (self.long[i] * self.count[i] + short * n_new) / c
            self.count[i] = c
        else:
            a = 1.0 - (1.0 - self.alpha) ** n_new
            self.long[i] = (1 - a) * self.long[i] + a * short
        return self.long[i]

    def act(self, obs: Observation) -> list[int]:
        out = []
        for i, t in enumerate(obs.tenants):
            short = latency(t, self.kind)
            L = self.L[i]
            if t.samples > 0 and short > 0:
                long = self._update_long(i, short, max(t.completions * self.fresh, 1e-9))
                if long / short > 2.0:
                    self.long[i] = long = 0.95 * long
                if t.in_flight >= L / 2:
                    g = min(1.0, max(0.5, self.tolerance * long / short))
                    L = (1 - self.smoothing) * L + self.smoothing * (L * g + self.queue)
                    self.L[i] = L = min(float(self.lim.max), max(float(self.lim.min), L))
            out.append(to_delta(L, t.limit, self.lim.max_step))
        return out

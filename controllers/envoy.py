"""Envoy's adaptive-concurrency gradient controller, one instance per tenant.

Per tenant, every decision, with sampleRTT = this window's median latency (``sample_aggregate_percentile``
default p50) and minRTT = the no-load latency::

    g = clamp(minRTT · (1 + buffer) / sampleRTT, 0.5, 2)      (buffer 25%)
    L = clamp(L · g + √(L · g), min, max)                      (√ headroom so L never stagnates)

minRTT is re-measured every ``min_rtt_interval_s`` plus a jitter drawn from [0, 15%) of it (from the
reset seed): Envoy pins the limit to ``min_concurrency`` to measure it, which causes 503 bursts (the
reference's pitfalls; Envoy PR #46602 measures from live traffic instead). We do the latter: over each
measurement epoch we keep the smallest window sampleRTT backed by enough requests (≥ ``request_count`` in
the epoch, default 50); at the epoch's end it becomes minRTT, so a baseline that moved is followed without
ever pinning the limit. Before the first epoch ends, minRTT is the smallest sample seen so far.
Source: envoyproxy/envoy ``adaptive_concurrency/controller/gradient_controller.cc`` and the filter doc.
Latency input (controllers/common.py): window TTFT p50 on the token engine; e2e p50 on the slot engine.
"""

from __future__ import annotations

import math

import numpy as np
from admit.controllers.common import latency, latency_kind, to_delta
from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class EnvoyGradientController:
    name = "envoy"

    def __init__(self, buffer: float = 0.25, min_rtt_interval_s: float = 60.0, jitter: float = 0.15,
                 request_count: int = 50) -> None:
        self.buffer, self.interval, self.jitter, self.request_count = buffer, min_rtt_interval_s, jitter, request_count

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.lim = spec.limits
        self.kind = latency_kind(spec)
        self.rng = np.random.default_rng(seed)
        n = spec.n_tenants
        self.L = [float(spec.limits.initial)] * n
        self.min_rtt = [math.inf] * n  # in force
        self.epoch_min = [math.inf] * n  # being measured
        self.epoch_n = [0.0] * n
        self.measured = [False] * n
        self.epoch_end = [self._next_end(0.0) for _ in range(n)]

    def _next_end(self, now: float) -> float:
        return now + self.interval * (1.0 + self.jitter * float(self.rng.random()))

    def act(self, obs: Observation) -> list[int]:
        out = []
        for i, t in enumerate(obs.tenants):
            sample = latency(t, self.kind)
            if t.samples > 0 and sample > 0:
                self.epoch_min[i] = min(self.epoch_min[i], sample)
                self.epoch_n[i] += t.completions
                if not self.measured[i]:  # no epoch finished yet: the smallest sample so far
                    self.min_rtt[i] = min(self.min_rtt[i], sample)
            if obs.time_s >= self.epoch_end[i]:  # epoch over: adopt its measurement if it had enough requests
                if self.epoch_n[i] >= self.request_count and math.isfinite(self.epoch_min[i]):
                    self.min_rtt[i], self.measured[i] = self.epoch_min[i], True
                self.epoch_min[i], self.epoch_n[i] = math.inf, 0.0
                self.epoch_end[i] = self._next_end(obs.time_s)
            L = self.L[i]
            if t.samples > 0 and sample > 0 and math.isfinite(self.min_rtt[i]):
                g = min(2.0, max(0.5, self.min_rtt[i] * (1.0 + self.buffer) / sample))
                L = L * g + math.sqrt(L * g)
                self.L[i] = L = min(float(self.lim.max), max(float(self.lim.min), L))
            out.append(to_delta(L, t.limit, self.lim.max_step))
        return out

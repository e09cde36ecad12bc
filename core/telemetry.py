"""Per-tenant telemetry windows and the construction of an Observation from them.

Both worlds feed the same windows with the same events (arrival, completion, drop, rejection) stamped
with their own clock, and build the Observation the same way; only the engine gauges (memory, running,
waiting) come from different places (the simulated engine, or vLLM's /metrics and NVML).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from admit.core.observation import NO_SLO, Observation, TenantObservation
from admit.core.percentiles import p50_p95_p99
from admit.core.spec import ControlSpec


class TenantWindows:
    """Sliding windows of one tenant's events over ``window_s`` seconds.

    Completions are kept as one deque of ``(t, e2e, ttft, wait)`` so that a decision prunes once and sorts
    three short lists (and only when the window changed since the last decision); arrivals, drops and
    rejections are deques of timestamps. ``slo`` = (e2e p99, TTFT p99) objectives, ``inf`` for none.
    """

    __slots__ = ("_arrivals", "_cache", "_done", "_drops", "_rejections", "_slo", "horizon_s")

    def __init__(self, window_s: float, slo: tuple[float, float] = (math.inf, math.inf)) -> None:
        if not window_s > 0:
            raise ValueError(f"window must be > 0 s, got {window_s}")
        self.horizon_s = window_s
        self._done: deque[tuple[float, float, float, float]] = deque()
        self._cache: tuple[float, ...] | None = None  # percentiles of _done, None when _done changed
        self._arrivals: deque[float] = deque()
        self._drops: deque[float] = deque()
        self._rejections: deque[float] = deque()
        self._slo = tuple(NO_SLO if v == math.inf else float(v) for v in slo)

    def on_arrival(self, t: float) -> None:
        self._arrivals.append(t)

    def on_completion(self, t: float, e2e_s: float, ttft_s: float, wait_s: float) -> None:
        self._done.append((t, e2e_s, ttft_s, wait_s))
        self._cache = None

    def on_drop(self, t: float) -> None:
        self._drops.append(t)

    def on_rejection(self, t: float) -> None:
        self._rejections.append(t)

    def summary(self, now: float) -> tuple[float, ...]:
        """Window features in TenantObservation order, from ``arrivals`` to ``slo_ttft_p99``."""
        cutoff = now - self.horizon_s
        done = self._done
        if done and done[0][0] <= cutoff:
            pop = done.popleft
            while done and done[0][0] <= cutoff:
                pop()
            self._cache = None
        # the three event deques: prune (usually nothing to drop, and drops/rejections are usually empty)
        a = self._arrivals
        while a and a[0] <= cutoff:
            a.popleft()
        d = self._drops
        while d and d[0] <= cutoff:
            d.popleft()
        r = self._rejections
        while r and r[0] <= cutoff:
            r.popleft()
        pct = self._cache
        if pct is None:  # windows change less often than decisions are made: compute only then
            n = len(done)
            if n > 1:
                _, e2e, ttft, wait = zip(*done, strict=True)
                # percentiles.LINEAR (numpy's default), in the simulator's windows and the gateway's alike
                pct = (
                    *p50_p95_p99(sorted(e2e)),
                    *p50_p95_p99(sorted(ttft)),
                    float(n),
                    p50_p95_p99(sorted(wait))[2],
                    *self._slo,
                )
            elif n == 1:
                _, e, f, w = done[0]
                pct = (e, e, e, f, f, f, 1.0, w, *self._slo)
            else:
                pct = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, *self._slo)
            self._cache = pct
        return (float(len(a)), float(len(done)), float(len(d)), float(len(r)), *pct)


class AdmissionCounts(Protocol):
    """What an Observation reads of the admission state: the simulator's AdmissionCore, the gateway's snapshot."""

    def queue_depth(self, tenant: int) -> int: ...

    def in_flight(self, tenant: int) -> int: ...

    def limit(self, tenant: int) -> int: ...


def build_observation(
    now: float,
    spec: ControlSpec,
    windows: Sequence[TenantWindows],
    core: AdmissionCounts,
    gpu_mem_util: float,
    engine_running: float,
    engine_waiting: float,
) -> Observation:
    tenants = [
        TenantObservation(float(core.queue_depth(i)), float(core.in_flight(i)), float(core.limit(i)), *w.summary(now))
        for i, w in enumerate(windows)
    ]
    return Observation(
        time_s=now,
        window_s=spec.window_s,
        gpu_mem_util=float(gpu_mem_util),
        engine_running=float(engine_running),
        engine_waiting=float(engine_waiting),
        tenants=tenants,
    )


def observation_values(
    now: float,
    windows: Sequence[TenantWindows],
    core: AdmissionCounts,
    gpu_mem_util: float,
    engine_running: float,
    engine_waiting: float,
) -> list[float]:
    """What ``build_observation`` puts into an Observation, as one flat list in vector order
    (``Observation.from_vector(values, now, window_s)`` is that Observation) — for callers that need the
    vector at every step and the Observation object rarely (the training env)."""
    values = [float(gpu_mem_util), float(engine_running), float(engine_waiting)]
    for i, w in enumerate(windows):
        values += (float(core.queue_depth(i)), float(core.in_flight(i)), float(core.limit(i)))
        values += w.summary(now)
    return values

"""Per-tenant telemetry windows and the construction of an Observation from them.

Both worlds feed the same windows with the same events (arrival, completion, drop, rejection) stamped
with their own clock, and build the Observation the same way; only the engine gauges (memory, running,
waiting) come from different places (the simulated engine, or vLLM's /metrics and NVML).
"""

from __future__ import annotations

from collections.abc import Sequence

from admit.core.admission import AdmissionCore
from admit.core.observation import NO_SLO, Observation, TenantObservation
from admit.core.spec import ControlSpec
from admit.core.windows import EventWindow, LatencyWindow, percentiles

_QS = (50.0, 95.0, 99.0)


class TenantWindows:
    """Sliding windows of one tenant's events over ``window_s`` seconds."""

    __slots__ = ("arrivals", "completions", "drops", "e2e", "rejections", "ttft", "wait")

    def __init__(self, window_s: float) -> None:
        self.e2e = LatencyWindow(window_s)
        self.ttft = LatencyWindow(window_s)
        self.wait = LatencyWindow(window_s)
        self.arrivals = EventWindow(window_s)
        self.completions = EventWindow(window_s)
        self.drops = EventWindow(window_s)
        self.rejections = EventWindow(window_s)

    def on_arrival(self, t: float) -> None:
        self.arrivals.add(t)

    def on_completion(self, t: float, e2e_s: float, ttft_s: float, wait_s: float) -> None:
        self.completions.add(t)
        self.e2e.add(t, e2e_s)
        self.ttft.add(t, ttft_s)
        self.wait.add(t, wait_s)

    def on_drop(self, t: float) -> None:
        self.drops.add(t)

    def on_rejection(self, t: float) -> None:
        self.rejections.add(t)

    def fill(self, obs: TenantObservation, now: float) -> None:
        e2e = sorted(self.e2e.values(now))
        obs.e2e_p50, obs.e2e_p95, obs.e2e_p99 = percentiles(e2e, _QS)
        obs.ttft_p50, obs.ttft_p95, obs.ttft_p99 = percentiles(sorted(self.ttft.values(now)), _QS)
        obs.queue_wait_p99 = percentiles(sorted(self.wait.values(now)), (99.0,))[0]
        obs.samples = float(len(e2e))
        obs.arrivals = float(self.arrivals.count(now))
        obs.completions = float(self.completions.count(now))
        obs.drops = float(self.drops.count(now))
        obs.rejections = float(self.rejections.count(now))


def _slo(v: float) -> float:
    return NO_SLO if v == float("inf") else v


def build_observation(
    now: float,
    spec: ControlSpec,
    windows: Sequence[TenantWindows],
    core: AdmissionCore,
    gpu_mem_util: float,
    engine_running: float,
    engine_waiting: float,
) -> Observation:
    tenants = []
    for i, (w, ts) in enumerate(zip(windows, spec.tenants, strict=True)):
        t = TenantObservation(
            queue_depth=float(core.queue_depth(i)),
            in_flight=float(core.in_flight(i)),
            limit=float(core.limit(i)),
            slo_e2e_p99=_slo(ts.slo_e2e_p99_s),
            slo_ttft_p99=_slo(ts.slo_ttft_p99_s),
        )
        w.fill(t, now)
        tenants.append(t)
    return Observation(
        time_s=now,
        window_s=spec.window_s,
        gpu_mem_util=float(gpu_mem_util),
        engine_running=float(engine_running),
        engine_waiting=float(engine_waiting),
        tenants=tenants,
    )

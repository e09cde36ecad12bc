"""Per-tenant telemetry windows and the construction of an Observation from them.

Both worlds feed the same windows with the same events (arrival, completion, drop, rejection) stamped
with their own clock, and build the Observation the same way; only the engine gauges (memory, running,
waiting, preemptions) and the token footprints (`TenantTokens`) come from different places: the simulated
engine and admission core, or the gateway's own requests and vLLM's /metrics.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from admit.core.observation import NO_SLO, Observation, TenantObservation
from admit.core.percentiles import linear_at, p50_p95_p99
from admit.core.spec import ControlSpec


class TenantTokens(NamedTuple):
    """Per tenant, the token footprints an Observation carries (core/observation.py's definitions)."""

    queued: list[float]  # prompt tokens of its requests in the admission queue
    prefill: list[float]  # prompt tokens of its admitted requests with no first token yet
    in_flight: list[float]  # prompt + generated so far of its admitted, unfinished requests

    @classmethod
    def zeros(cls, n: int) -> TenantTokens:
        return cls([0.0] * n, [0.0] * n, [0.0] * n)


def _objective(v: float) -> float:
    return NO_SLO if v == math.inf else float(v)


class TenantWindows:
    """Sliding windows of one tenant's events over ``window_s`` seconds.

    Completions are kept as one deque of ``(t, e2e, ttft, wait, tpot, output tokens, good)`` so that a
    decision prunes once and sorts four short lists (and only when the window changed since the last
    decision); arrivals, drops and rejections are deques of timestamps. ``slo`` = (e2e p99, TTFT p99)
    window objectives and ``request_slo`` = (TTFT, TPOT, e2e) per-request ones, ``inf`` for none; the caller
    judges a completion good (core.slo.is_good) and says so.
    """

    __slots__ = ("_arrivals", "_cache", "_done", "_drops", "_rejections", "_request_slo", "_slo", "horizon_s")

    def __init__(self, window_s: float, slo: tuple[float, float] = (math.inf, math.inf),
                 request_slo: tuple[float, float, float] = (math.inf, math.inf, math.inf)) -> None:
        if not window_s > 0:
            raise ValueError(f"window must be > 0 s, got {window_s}")
        self.horizon_s = window_s
        self._done: deque[tuple[float, float, float, float, float, int, bool]] = deque()
        self._cache: tuple[float, ...] | None = None  # percentiles of _done, None when _done changed
        self._arrivals: deque[float] = deque()
        self._drops: deque[float] = deque()
        self._rejections: deque[float] = deque()
        self._slo = tuple(_objective(v) for v in slo)
        self._request_slo = tuple(_objective(v) for v in request_slo)

    def on_arrival(self, t: float) -> None:
        self._arrivals.append(t)

    def on_completion(self, t: float, e2e_s: float, ttft_s: float, wait_s: float, tpot_s: float = 0.0,
                      output_tokens: int = 0, good: bool = False) -> None:
        self._done.append((t, e2e_s, ttft_s, wait_s, tpot_s, output_tokens, good))
        self._cache = None

    def on_drop(self, t: float) -> None:
        self._drops.append(t)

    def on_rejection(self, t: float) -> None:
        self._rejections.append(t)

    def prune(self, now: float) -> None:
        """Drop the events that are out of the window at ``now``. `summary` does it; a caller that records events
        and asks for summaries seldom or never (the gateway without a control loop) calls it as it goes, or the
        deques keep every event."""
        cutoff = now - self.horizon_s
        done = self._done
        if done and done[0][0] <= cutoff:
            pop = done.popleft
            while done and done[0][0] <= cutoff:
                pop()
            self._cache = None
        # the three event deques (usually nothing to drop, and drops/rejections are usually empty)
        a = self._arrivals
        while a and a[0] <= cutoff:
            a.popleft()
        d = self._drops
        while d and d[0] <= cutoff:
            d.popleft()
        r = self._rejections
        while r and r[0] <= cutoff:
            r.popleft()

    def summary(self, now: float) -> tuple[float, ...]:
        """Window features in TenantObservation order, from ``arrivals`` to ``slo_e2e`` (the token footprints
        that follow come from the caller)."""
        self.prune(now)
        done = self._done
        a, d, r = self._arrivals, self._drops, self._rejections
        pct = self._cache
        if pct is None:  # windows change less often than decisions are made: compute only then
            n = len(done)
            w_s = self.horizon_s
            if n > 1:
                _, e2e, ttft, wait, tpot, out, good = zip(*done)  # noqa: B905 (7 fields each)
                # percentiles.LINEAR (numpy's default), in the simulator's windows and the gateway's alike
                tp = p50_p95_p99(sorted(tpot))
                pct = (
                    *p50_p95_p99(sorted(e2e)),
                    *p50_p95_p99(sorted(ttft)),
                    float(n),
                    linear_at(sorted(wait), 0, n, 0.99),
                    *self._slo,
                    sum(out) / w_s,
                    tp[0],
                    tp[2],
                    sum(good) / w_s,
                    *self._request_slo,
                )
            elif n == 1:
                _, e, f, w, p, o, g = done[0]
                pct = (e, e, e, f, f, f, 1.0, w, *self._slo, o / w_s, p, p, float(g) / w_s, *self._request_slo)
            else:
                pct = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, *self._slo, 0.0, 0.0, 0.0, 0.0, *self._request_slo)
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
    tokens: TenantTokens | None = None,
    preemptions: float = 0.0,
) -> Observation:
    tok = tokens if tokens is not None else TenantTokens.zeros(len(windows))
    tenants = [
        TenantObservation(*(float(core.queue_depth(i)), float(core.in_flight(i)), float(core.limit(i)),
                            *w.summary(now), tok.queued[i], tok.prefill[i], tok.in_flight[i]))
        for i, w in enumerate(windows)
    ]
    return Observation(
        time_s=now,
        window_s=spec.window_s,
        gpu_mem_util=float(gpu_mem_util),
        engine_running=float(engine_running),
        engine_waiting=float(engine_waiting),
        tenants=tenants,
        prefill_tokens_waiting=float(sum(tok.prefill)),
        preemptions=float(preemptions),
    )


def observation_values(
    now: float,
    windows: Sequence[TenantWindows],
    core: AdmissionCounts,
    gpu_mem_util: float,
    engine_running: float,
    engine_waiting: float,
    tokens: TenantTokens | None = None,
    preemptions: float = 0.0,
) -> list[float]:
    """What ``build_observation`` puts into an Observation, as one flat list in vector order
    (``Observation.from_vector(values, now, window_s)`` is that Observation) — for callers that need the
    vector at every step and the Observation object rarely (the training env)."""
    tok = tokens if tokens is not None else TenantTokens.zeros(len(windows))
    values = [float(gpu_mem_util), float(engine_running), float(engine_waiting), float(sum(tok.prefill)),
              float(preemptions)]
    for i, w in enumerate(windows):
        values += (float(core.queue_depth(i)), float(core.in_flight(i)), float(core.limit(i)))
        values += w.summary(now)
        values += (tok.queued[i], tok.prefill[i], tok.in_flight[i])
    return values


class PreemptionWindow:
    """Preemptions in the last ``window_s`` seconds from samples of a cumulative counter: the simulated
    engine's, sampled at each observation, or vLLM's ``num_preemptions_total``, sampled at each scrape."""

    __slots__ = ("_samples", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, t: float, total: float) -> None:
        s = self._samples
        s.append((t, total))
        cutoff = t - self.window_s
        while len(s) > 1 and s[1][0] <= cutoff:  # keep the newest sample at or before the window's start
            s.popleft()

    def count(self, now: float) -> float:
        """The counter's growth from the last sample at or before ``now - window_s`` (else the first sample)
        to the newest one; 0 before two samples."""
        s = self._samples
        if len(s) < 2:
            return 0.0
        cutoff = now - self.window_s
        base = s[0][1]
        for t, v in s:
            if t > cutoff:
                break
            base = v
        return max(0.0, s[-1][1] - base)

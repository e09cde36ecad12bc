"""Sliding time windows of latency samples and their percentiles.

Percentiles use linear interpolation between order statistics (numpy's default "linear" method), computed
in pure Python because windows are small and this runs on every decision.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence


def percentiles(sorted_values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Linear-interpolation percentiles (q in [0, 100]) of an already sorted sequence; [] gives 0.0s."""
    n = len(sorted_values)
    if n <= 1:
        return [float(sorted_values[0]) if n else 0.0] * len(qs)
    out = []
    for q in qs:
        pos = (n - 1) * q / 100.0
        lo = math.floor(pos)
        hi = lo + 1 if lo + 1 < n else lo
        frac = pos - lo
        out.append(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)
    return out


def p50_p95_p99(v: Sequence[float]) -> tuple[float, float, float]:
    """``percentiles(v, (50, 95, 99))`` for a sorted sequence, unrolled: it runs on every decision."""
    n = len(v)
    if n <= 1:
        x = float(v[0]) if n else 0.0
        return x, x, x
    m = n - 1
    out = []
    for pos in (m * 0.5, m * 0.95, m * 0.99):
        lo = int(pos)
        if lo >= m:
            out.append(v[m])
        else:
            out.append(v[lo] + (v[lo + 1] - v[lo]) * (pos - lo))
    return out[0], out[1], out[2]


class LatencyWindow:
    """Samples ``(t, value)`` kept for ``horizon_s`` seconds; ``t`` must be non-decreasing."""

    __slots__ = ("_samples", "horizon_s")

    def __init__(self, horizon_s: float) -> None:
        if not horizon_s > 0:
            raise ValueError(f"window horizon must be > 0 s, got {horizon_s}")
        self.horizon_s = horizon_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, t: float, value: float) -> None:
        self._samples.append((t, value))

    def prune(self, now: float) -> None:
        cutoff = now - self.horizon_s
        s = self._samples
        while s and s[0][0] <= cutoff:
            s.popleft()

    def __len__(self) -> int:
        return len(self._samples)

    def values(self, now: float) -> list[float]:
        self.prune(now)
        return [v for _, v in self._samples]

    def percentiles(self, now: float, qs: Sequence[float] = (50.0, 95.0, 99.0)) -> list[float]:
        return percentiles(sorted(self.values(now)), qs)


class EventWindow:
    """Timestamps of events kept for ``horizon_s`` seconds: counts arrivals, drops, completions."""

    __slots__ = ("_times", "horizon_s")

    def __init__(self, horizon_s: float) -> None:
        if not horizon_s > 0:
            raise ValueError(f"window horizon must be > 0 s, got {horizon_s}")
        self.horizon_s = horizon_s
        self._times: deque[float] = deque()

    def add(self, t: float) -> None:
        self._times.append(t)

    def count(self, now: float) -> int:
        cutoff = now - self.horizon_s
        s = self._times
        while s and s[0] <= cutoff:
            s.popleft()
        return len(s)

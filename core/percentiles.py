"""Percentiles: the definitions admit's reports use, each under its own name.

A p99 of a few hundred samples depends on the definition as much as on the data, so every report that
computes one says which of these it is, and two numbers that are compared use the same one:

* :data:`LINEAR` — linear interpolation between order statistics: numpy's default ``method="linear"``
  (Hyndman & Fan's type 7). ``q`` in [0, 100] sits at position ``(n - 1)·q/100`` of the sorted samples.
  The simulator's and the gateway's windows (core/telemetry.py, through :func:`p50_p95_p99`), the episode
  and evaluation summaries, the fidelity and LLM-call reports.
* :data:`NEAREST_RANK` — the sample of rank ``ceil(q/100·n)`` (at least 1): numpy's ``method="inverted_cdf"``.
  What the load generator reports (its histogram's buckets, loadgen/histogram.py) and so what sim2live
  uses on its simulated side too, so the two sides are compared like for like.
* :data:`HISTOGRAM` — Prometheus's ``histogram_quantile`` on cumulative buckets: the bucket that holds rank
  ``q·count``, interpolated linearly inside it. What the gateway reads from the backend's TTFT histogram.

:func:`linear_at` (and :func:`linear`, :func:`p50_p95_p99` on it) is pure Python (it runs on every decision,
on windows of tens of samples, where numpy's call overhead dominates) that numba also compiles for the compiled
world (envs/kernels.py); :func:`linear_np` gives ``np.percentile``'s numbers from one numpy sort,
:func:`nearest_rank` is numpy's, for arrays. The pure-Python and numpy linear percentiles agree to rounding,
not always to the last bit, so one report uses one of them throughout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

LINEAR = "linear interpolation between order statistics (numpy method='linear')"
NEAREST_RANK = "nearest rank, the sample of rank ceil(q/100 n) (numpy method='inverted_cdf')"
HISTOGRAM = "Prometheus histogram_quantile (linear inside the bucket that holds the rank)"


def linear_at(v: Any, lo: int, n: int, f: float) -> Any:
    """:data:`LINEAR` percentile at fraction ``f`` (q/100, in [0, 1]) of the sorted ``v[lo:lo + n]``, n >= 2:
    position ``(n - 1)·f``, and linearly between the two order statistics around it.

    The one implementation of the windows' percentiles: Python calls it as it is (:func:`p50_p95_p99`, the
    telemetry windows) and envs/kernels.py compiles this very function with numba for the compiled world, so
    both worlds do the same arithmetic in the same order and agree bit for bit. Hence the numba-compilable
    body (indexing and float arithmetic only) and the slice given as ``lo``, ``n`` (the kernels keep every
    tenant's window in one flat array). numba's cache checks only the time stamp of the file a kernel is in
    (numba/numba#8396 would extend it to other files): after changing this function, touch envs/kernels.py
    before `python -m admit.envs.compiled`, or the kernels keep the old arithmetic (tests/envs/test_compiled_world.py
    would then find the two worlds apart).
    """
    m = n - 1
    pos = m * f
    i = int(pos)
    if i >= m:
        return v[lo + m]
    return v[lo + i] + (v[lo + i + 1] - v[lo + i]) * (pos - i)


def linear(sorted_values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """:data:`LINEAR` percentiles (q in [0, 100]) of an already sorted sequence; [] gives 0.0s."""
    n = len(sorted_values)
    if n <= 1:
        return [float(sorted_values[0]) if n else 0.0] * len(qs)
    return [linear_at(sorted_values, 0, n, q / 100.0) for q in qs]


def p50_p95_p99(v: Sequence[float]) -> tuple[float, float, float]:
    """``linear(v, (50, 95, 99))`` of a sorted sequence: three windows' worth on every decision."""
    n = len(v)
    if n <= 1:
        x = float(v[0]) if n else 0.0
        return x, x, x
    return linear_at(v, 0, n, 0.5), linear_at(v, 0, n, 0.95), linear_at(v, 0, n, 0.99)


def linear_np(values: Sequence[float] | np.ndarray, q: float) -> float:
    """:data:`LINEAR` percentile ``q`` (in [0, 100]) of unsorted ``values`` (at least one), as ``np.percentile``
    gives it."""
    return linear_np_many(values, (q,))[0]


def linear_np_many(values: Sequence[float] | np.ndarray, qs: Sequence[float]) -> list[float]:
    """``np.percentile(values, qs)`` (its default linear method) with one sort, as Python floats.

    numpy's own call costs ~25 µs of overhead on top of the work, and an episode summary takes fifteen of
    them; this does numpy's arithmetic itself on the sorted values — position ``(n - 1)·q/100``, the two
    order statistics around it, and numpy's ``_lerp`` (``a + (b − a)·t``, or ``b − (b − a)·(1 − t)`` from
    t = 0.5 on) — so every number is the one ``np.percentile`` returns (tests/core/test_percentiles.py compares
    them bit for bit). NaN anywhere gives NaN, as there."""
    for q in qs:
        if not 0 <= q <= 100:
            raise ValueError("Percentiles must be in the range [0, 100]")
    a = np.sort(np.asarray(values, dtype=np.float64).ravel())
    n = a.shape[0]
    if n == 0:
        raise IndexError("percentiles of no values")
    if math.isnan(a[-1]):  # sorting puts NaN last
        return [math.nan] * len(qs)
    last = n - 1
    out = []
    for q in qs:
        pos = last * (q / 100)
        if pos >= last:
            out.append(float(a[last]))
            continue
        lo = math.floor(pos)
        t = pos - lo
        x, y = float(a[lo]), float(a[lo + 1])
        d = y - x
        out.append(y - d * (1 - t) if t >= 0.5 else x + d * t)
    return out


def nearest_rank(values: Sequence[float] | np.ndarray, q: float) -> float:
    """:data:`NEAREST_RANK` percentile ``q`` (in [0, 100]) of unsorted ``values`` (at least one), by numpy."""
    return float(np.percentile(values, q, method="inverted_cdf"))


def nearest_rank_index(q: float, n: int) -> int:
    """The 1-based rank :data:`NEAREST_RANK` picks among ``n`` >= 1 sorted samples: ``ceil(q/100·n)``, at least 1."""
    return max(1, math.ceil(q / 100.0 * n))


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """:data:`HISTOGRAM`: Prometheus's histogram_quantile (q in [0, 1]) on cumulative ``(le, count)`` pairs,
    sorted by ``le`` and ending with ``+Inf``; None without observations. A rank in the ``+Inf`` bucket
    reads as the largest finite bound, as Prometheus answers."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lo_le, lo_n = 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == math.inf:
                return lo_le
            return lo_le + (le - lo_le) * ((rank - lo_n) / (n - lo_n) if n > lo_n else 0.0)
        lo_le, lo_n = le, n
    return lo_le

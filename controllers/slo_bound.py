"""A confidence interval on "how often does this tenant miss its objective", from a longer history.

A latency objective "p99 ≤ S" holds exactly when the share of requests slower than S is ≤ 1%. So instead
of comparing one window's p99 with S (the study's failure: a p99 over a handful of requests is noise), we
estimate the miss share over the last ``history_s`` seconds and put a binomial confidence interval on it:

1. Per window, the share above S is read off the window's p50/p95/p99 by interpolating the log-survival
   function linearly through (0, 1), (p50, 0.5), (p95, 0.05), (p99, 0.01) and extending it past p99 with
   the exponential tail those two upper points imply (scale (p99 − p95) / ln 5).
2. Windows overlap (window_s > interval_s), so each observation contributes its completions × interval /
   window new requests, n_w, and n_w · share_w estimated misses.
3. Over the history, p̂ = misses / n with n = Σ n_w, and the Wilson score interval at z (1.645: one-sided
   95%) gives [lcb, ucb]. The objective is *violated with confidence* when lcb > 1 − q and *met with
   confidence* when ucb < 1 − q — the order-statistic view of the same test on the q-quantile.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

_LOG5 = math.log(5.0)


def share_above(p50: float, p95: float, p99: float, x: float) -> float:
    """Estimated fraction of a window's requests slower than ``x`` from its three percentiles."""
    if x <= 0:
        return 1.0
    if x > p99:
        scale = (p99 - p95) / _LOG5
        return 0.01 * math.exp(-(x - p99) / scale) if scale > 0 else 0.0
    pts = ((0.0, 1.0), (p50, 0.5), (p95, 0.05), (p99, 0.01))
    for (x0, s0), (x1, s1) in itertools.pairwise(pts):
        if x <= x1:
            if x1 <= x0:
                return s1
            f = (x - x0) / (x1 - x0)
            return math.exp((1 - f) * math.log(s0) + f * math.log(s1))
    return 0.01


def wilson(misses: float, n: float, z: float) -> tuple[float, float]:
    if n <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, misses / n))
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


class MissHistory:
    """Estimated misses of one objective over a sliding horizon of observations."""

    def __init__(self, history_s: float) -> None:
        self.history_s = history_s
        self.items: deque[tuple[float, float, float]] = deque()  # (time, n new, misses)
        self.n = 0.0
        self.misses = 0.0

    def add(self, time_s: float, n_new: float, share: float) -> None:
        self.items.append((time_s, n_new, n_new * share))
        self.n += n_new
        self.misses += n_new * share
        while self.items and self.items[0][0] <= time_s - self.history_s:
            _, n, m = self.items.popleft()
            self.n -= n
            self.misses -= m

    def bounds(self, z: float) -> tuple[float, float]:
        return wilson(self.misses, self.n, z)

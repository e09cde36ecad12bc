"""Summaries over seeds: the mean, spread and 95% interval every figure admit reports over repeated runs carries
(an evaluation's metrics, evaluate/offline.py; a recipe's validation returns over its seeds, train/trainer.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def summarize(values: Sequence[float], lower: float | None = None) -> dict[str, float | list[float]]:
    """The mean, the sample standard deviation and the 95% Student-t interval of ``values`` (0 wide for one value).

    ``lower``: a bound the quantity cannot go below (a count: 0); the interval is clipped there, i.e. intersected
    with the values the mean can take. That keeps its coverage (the true mean lies above the bound, so the clipped
    interval holds it whenever the t-interval does) and leaves the mean and the upper end as they are; a sample of
    many zeros and a few large counts, whose t-interval reaches below 0, gets [0, upper]."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)) if n > 1 else 0.0
    lo = mean - half if lower is None else max(mean - half, lower)
    return {"mean": mean, "std": std, "ci95": [lo, mean + half]}

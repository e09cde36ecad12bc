"""Cumulative-bucket histograms with vLLM's bucket boundaries, cheap to observe from the engine loop.

prometheus_client's ``Histogram`` takes a lock per observation; the engine loop observes one
inter-token latency per streamed token (tens of thousands per second at 500 streams), so the emulator
keeps its own counts and hands them to a collector at scrape time (see :mod:`admit.emulator.metrics`).

Bucket lists are vLLM V1's (``vllm/v1/metrics/loggers.py``, as listed in the project's simulation
reference): each histogram there has exactly these upper bounds, plus ``+Inf``.
"""

from __future__ import annotations

import bisect

from prometheus_client.utils import floatToGoString

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)


def buckets_1_2_5(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to and including ``limit`` (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            v = m * scale
            if v > limit:
                return tuple(out)
            out.append(v)
        scale *= 10


class Hist:
    """Counts per bucket (not cumulative until exported), their sum and count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must be strictly increasing, got {bounds}")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """Record ``n`` observations of ``value`` (a value equal to a bound falls in that bound's bucket)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs in exposition order, ending with ``+Inf``."""
        out = []
        acc = 0
        for b, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((_le(b), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


def _le(b: float) -> str:
    return floatToGoString(b)

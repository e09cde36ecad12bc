"""vLLM's histogram bucket boundaries, for the emulator's scrape-time histograms.

prometheus_client's ``Histogram`` takes a lock per observation; the engine loop observes one
inter-token latency per streamed token (tens of thousands per second at 500 streams), so the emulator
keeps its own counts in core/histogram.py's ``BucketHistogram`` (the gateway's too; ``Hist`` here is that
class) and hands them to a collector at scrape time (see :mod:`admit.emulator.metrics`).

Bucket lists are vLLM V1's (``vllm/v1/metrics/loggers.py``, as listed in the project's simulation
reference): each histogram there has exactly these upper bounds, plus ``+Inf``.
"""

from __future__ import annotations

from admit.core.histogram import BucketHistogram

Hist = BucketHistogram  # the emulator's name for it

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

"""The scrape-time Prometheus histogram of the gateway's and the emulator's ``/metrics``.

prometheus_client's ``Histogram`` takes a lock and looks up its labels on every observation, several
microseconds each; the gateway observes four latencies per request and the emulator one inter-token latency
per streamed token (tens of thousands a second at 500 streams). Both keep plain counts in a
:class:`BucketHistogram` instead — an observation is a bisect and three additions — and turn them into a
``HistogramMetricFamily`` only when ``/metrics`` is scraped (:meth:`BucketHistogram.add_to`), so the page is
prometheus_client's own exposition of the same numbers.

Bounds are upper bounds, inclusive as in Prometheus (a value equal to a bound falls in that bound's bucket),
plus ``+Inf``. The load generator's histogram (loadgen/histogram.py) is a different kind: log-linear and
mergeable across processes, for percentiles of a load run, never exposed to Prometheus.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class BucketHistogram:
    """Counts per bucket (not cumulative until exported), their sum and count."""

    __slots__ = ("_les", "bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must be strictly increasing, got {tuple(bounds)}")
        self.bounds = tuple(float(b) for b in bounds)
        self._les = [floatToGoString(b) for b in self.bounds]  # the ``le`` labels, as prometheus_client writes them
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """Record ``n`` observations of ``value``."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs in exposition order, ending with ``+Inf``."""
        out = []
        acc = 0
        for le, c in zip(self._les, self.counts, strict=False):
            acc += c
            out.append((le, acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out

    def add_to(self, family: HistogramMetricFamily, labels: Sequence[str]) -> None:
        """Add this histogram to ``family`` as the series with these label values."""
        family.add_metric(list(labels), buckets=self.cumulative(), sum_value=self.sum)

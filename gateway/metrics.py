"""Prometheus metrics of the gateway, prefix ``admit_gateway_``, on a private registry.

Counters and histograms are plain dicts of numbers updated per request (`Counts`, `Histograms`: an
increment, or core/histogram.py's bisect and three additions) and turned into Prometheus metric families only when
``/metrics`` is scraped; prometheus_client's own ``Counter``/``Histogram`` objects (a lock, a label
lookup and value objects per update) cost several microseconds per request on the hot path. Gauges of
state (queue depth, in flight, limits, envelope budget) are read from the admission backend and the
envelope book at scrape time, so the hot path pays nothing for them. The text page is prometheus_client's
exposition of the same families, so it reads exactly as it did with its objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from admit.core.histogram import BucketHistogram
from admit.gateway.envelopes import EnvelopeBook
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "admit_gateway_"
# 5 ms .. 120 s: queue waits and TTFT of an LLM server span this range
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 120)
NTPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class _StateCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]], book: EnvelopeBook, clock: Callable[[], float]) -> None:
        self._snapshot = snapshot
        self._book = book
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self._snapshot()
        fams = {
            "queue_depth": ("requests waiting in the tenant's queue", "queue_depth"),
            "in_flight": ("requests of the tenant at the backend", "in_flight"),
            "limit": ("the tenant's concurrency limit (nominal)", "limit"),
            "effective_limit": ("the tenant's limit including borrowed capacity", "effective_limit"),
        }
        for name, (doc, key) in fams.items():
            g = GaugeMetricFamily(PREFIX + name, doc, labels=["tenant"])
            for tenant, st in snap["tenants"].items():
                g.add_metric([tenant], float(st[key]))
            yield g
        now = self._clock()
        rem = GaugeMetricFamily(PREFIX + "envelope_remaining", "units left in a rate envelope", labels=_ENV_LABELS)
        ratio = GaugeMetricFamily(
            PREFIX + "envelope_remaining_ratio", "envelope units left / burst", labels=_ENV_LABELS
        )
        backoff = GaugeMetricFamily(
            PREFIX + "envelope_backoff_seconds", "seconds left in an envelope's backoff", labels=["tenant", "target"]
        )
        for tenant in snap["tenants"]:
            for env in self._book.envelopes(tenant):
                backoff.add_metric([tenant, env.cfg.target], max(0.0, env.backoff_until - now))
                for unit, b in env.buckets.items():
                    r = b.remaining(now)
                    rem.add_metric([tenant, env.cfg.target, unit], r)
                    ratio.add_metric([tenant, env.cfg.target, unit], r / b.burst)
        yield rem
        yield ratio
        yield backoff


_ENV_LABELS = ["tenant", "target", "unit"]


class Counts(Collector):
    """A counter family: ``inc(label values...)`` adds one; rendered as ``<name>_total`` at scrape time."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], registry: CollectorRegistry) -> None:
        self.name, self.doc, self.labelnames = name, doc, list(labels)
        self.values: dict[tuple[str, ...], int] = {}
        registry.register(self)

    def inc(self, *labels: str) -> None:
        v = self.values
        v[labels] = v.get(labels, 0) + 1

    def add(self, n: int, *labels: str) -> None:
        v = self.values
        v[labels] = v.get(labels, 0) + n

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for labels, n in list(self.values.items()):
            fam.add_metric(list(labels), float(n))
        yield fam


class Histograms(Collector):
    """A histogram family with one label (the tenant), one core ``BucketHistogram`` per tenant."""

    def __init__(self, name: str, doc: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.name, self.doc = name, doc
        self.bounds = tuple(float(b) for b in buckets)
        self.series: dict[str, BucketHistogram] = {}
        registry.register(self)

    def observe(self, tenant: str, x: float) -> None:
        h = self.series.get(tenant)
        if h is None:
            h = self.series[tenant] = BucketHistogram(self.bounds)
        h.observe(x)

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.doc, labels=["tenant"])
        for tenant, h in list(self.series.items()):
            h.add_to(fam, [tenant])
        yield fam


class _TokenGauges(Collector):
    def __init__(self, names: Sequence[str], read: Callable[[], Any]) -> None:
        self._names, self._read = list(names), read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tok = self._read()
        for name, doc, values in (
            ("prompt_tokens_queued", "prompt tokens of the tenant's requests waiting for admission", tok.queued),
            ("prefill_tokens", "prompt tokens of its admitted requests with no first byte yet", tok.prefill),
            ("tokens_in_flight", "prompt + streamed tokens of its admitted, unfinished requests", tok.in_flight),
        ):
            g = GaugeMetricFamily(PREFIX + name, doc, labels=["tenant"])
            for tenant, v in zip(self._names, values, strict=True):
                g.add_metric([tenant], float(v))
            yield g


class _LendingGauges(Collector):
    """Each tenant's borrowed and lent concurrency (core/contract.py ``lending``), read at scrape time."""

    def __init__(self, names: Sequence[str], read: Callable[[], tuple[Sequence[float], Sequence[float]]]) -> None:
        self._names, self._read = list(names), read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        borrowed, lent = self._read()
        for name, doc, values in (
            ("borrowed_concurrency", "the tenant's requests in flight beyond its contract's nominal share of the "
             "concurrency (all of them without a contract)", borrowed),
            ("lent_concurrency", "the part of the tenant's idle nominal share that borrowers use (each idle share "
             "in proportion, together at most what is borrowed)", lent),
        ):
            g = GaugeMetricFamily(PREFIX + name, doc, labels=["tenant"])
            for tenant, v in zip(self._names, values, strict=True):
                g.add_metric([tenant], float(v))
            yield g


class _Gauges(Collector):
    """Gauges and counters without labels, each read at scrape time."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, Callable[[], float]]] = []
        self.counters: list[tuple[str, str, Callable[[], float]]] = []

    def collect(self) -> Iterator[Metric]:
        for name, doc, read in self.items:
            yield GaugeMetricFamily(name, doc, value=float(read()))
        for name, doc, read in self.counters:
            yield CounterMetricFamily(name, doc, value=float(read()))


class GatewayMetrics:
    def __init__(self, snapshot: Callable[[], dict[str, Any]], book: EnvelopeBook, clock: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counts(PREFIX + "requests", "finished requests by outcome", ["tenant", "outcome"], r)
        self.admitted = Counts(PREFIX + "admitted", "requests sent to the backend", ["tenant"], r)
        self.deferred = Counts(PREFIX + "deferred", "requests answered 429, by reason", ["tenant", "reason"], r)
        self.alerts = Counts(PREFIX + "envelope_alerts", "an envelope fell below its alert threshold", _ENV_LABELS, r)
        self.connection_events = Counts(
            PREFIX + "connection_events",
            "connection guard events: head-too-large, head-timeout, body-timeout, write-timeout, idle-timeout, "
            "evicted-idle, evicted-slow, too-many-connections, bad-http (gateway/guard.py)", ["event"], r)
        self.errors = Counts(PREFIX + "errors", "requests that hit a bug of the gateway, by exception type",
                             ["type"], r)
        self.output_tokens = Counts(PREFIX + "output_tokens", "output tokens of completed requests (usage, else "
                                    "streamed events)", ["tenant"], r)
        self.good = Counts(PREFIX + "good_requests", "completed requests within every per-request objective of "
                           "their tenant (the goodput's count)", ["tenant"], r)
        self.contract_requests = Counts(
            PREFIX + "contract_requests", "requests of tenants with a contract by class at arrival: in (in contract) "
            "or excess (core/contract.py)", ["tenant", "class"], r)
        self.contract_good = Counts(PREFIX + "contract_good_requests", "in-contract requests that were good (their "
                                    "tenant's in-contract attainment: this over contract_requests{class=in})",
                                    ["tenant"], r)
        self.contract_excess_good = Counts(
            PREFIX + "contract_excess_good_requests", "out-of-contract (excess) requests of tenants with a contract "
            "that were good (their excess goodput's count)", ["tenant"], r)
        self.log_suppressed = Counts(
            PREFIX + "request_log_suppressed", "request-log lines of unauthenticated requests left out (rate limit)",
            [], r)
        self.queue_wait = Histograms(PREFIX + "queue_wait_seconds", "time in the tenant's queue", LATENCY_BUCKETS, r)
        self.ttft = Histograms(PREFIX + "ttft_seconds", "arrival to first byte of the answer", LATENCY_BUCKETS, r)
        self.e2e = Histograms(PREFIX + "e2e_seconds", "arrival to the end of the answer", LATENCY_BUCKETS, r)
        self.ntpot = Histograms(PREFIX + "ntpot_seconds", "end-to-end time / output tokens", NTPOT_BUCKETS, r)
        r.register(_StateCollector(snapshot, book, clock))
        self._gauges = _Gauges()
        r.register(self._gauges)
        self.started = time.time()

    def gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A gauge without labels read at scrape time."""
        self._gauges.items.append((PREFIX + name, doc, read))

    def counter(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A counter without labels read at scrape time (``<name>_total``)."""
        self._gauges.counters.append((PREFIX + name, doc, read))

    def token_gauges(self, names: Sequence[str], read: Callable[[], Any]) -> None:
        """The per-tenant token footprints (``read()`` gives a core.telemetry.TenantTokens) at scrape time."""
        self.registry.register(_TokenGauges(names, read))

    def lending_gauges(self, names: Sequence[str], read: Callable[[], tuple[Sequence[float], Sequence[float]]]
                       ) -> None:
        """The per-tenant borrowed and lent concurrency (``read()`` gives both lists) at scrape time."""
        self.registry.register(_LendingGauges(names, read))

    def render(self) -> bytes:
        return generate_latest(self.registry)

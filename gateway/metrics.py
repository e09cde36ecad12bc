"""Prometheus metrics of the gateway, prefix ``admit_gateway_``, on a private registry.

Counters and histograms are updated per request; gauges of state (queue depth, in flight, limits, envelope
budget) are read from the admission backend and the envelope book at scrape time, so the hot path pays
nothing for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from admit.gateway.envelopes import EnvelopeBook
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
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


class GatewayMetrics:
    def __init__(self, snapshot: Callable[[], dict[str, Any]], book: EnvelopeBook, clock: Callable[[], float]) -> None:
        disable_created_metrics()  # the *_created series double the scrape for nothing a dashboard uses
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            PREFIX + "requests", "finished requests by outcome", ["tenant", "outcome"], registry=r
        )
        self.admitted = Counter(PREFIX + "admitted", "requests sent to the backend", ["tenant"], registry=r)
        self.deferred = Counter(
            PREFIX + "deferred", "requests answered 429, by reason", ["tenant", "reason"], registry=r
        )
        self.alerts = Counter(
            PREFIX + "envelope_alerts", "an envelope fell below its alert threshold", _ENV_LABELS, registry=r
        )
        self.queue_wait = Histogram(
            PREFIX + "queue_wait_seconds", "time in the tenant's queue", ["tenant"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            PREFIX + "ttft_seconds", "arrival to first byte of the answer", ["tenant"], buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            PREFIX + "e2e_seconds", "arrival to the end of the answer", ["tenant"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.ntpot = Histogram(
            PREFIX + "ntpot_seconds", "end-to-end time / output tokens", ["tenant"], buckets=NTPOT_BUCKETS, registry=r
        )
        r.register(_StateCollector(snapshot, book, clock))
        self.started = time.time()

    def render(self) -> bytes:
        return generate_latest(self.registry)

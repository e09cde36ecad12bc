"""Prometheus view of the Redis admission backend: reachability, fail-open/closed decisions, lease upkeep,
script errors (per script; they are not outages, gateway/redis/admission.py) and values read from Redis that
were refused (per kind: limit, version, envelope); with contracts, the requests classified on the replica's
mirror while Redis was down or their script failed (gateway/redis/contracts.py)."""

from __future__ import annotations

from collections.abc import Iterator

from admit.gateway.metrics import PREFIX
from admit.gateway.redis.admission import RedisAdmission
from admit.gateway.redis.contracts import SharedContracts
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class RedisCollector(Collector):
    def __init__(self, backend: RedisAdmission, contracts: SharedContracts | None = None) -> None:
        self.b = backend
        self.contracts = contracts

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        b, s = self.b, self.b.stats
        yield GaugeMetricFamily(PREFIX + "redis_up", "1 while the shared admission state answers", value=float(b.up))
        yield GaugeMetricFamily(PREFIX + "redis_pending_releases", "releases waiting for Redis to come back",
                                value=float(len(b.pending_release)))
        for name, doc, value in (
            ("redis_errors", "Redis commands that failed or timed out", s.errors),
            ("redis_outages", "times Redis became unreachable", s.outages),
            ("redis_leases_expired", "leases Redis dropped because nobody renewed them", s.leases_expired),
            ("redis_leases_restored", "leases of running requests written back to Redis", s.leases_restored),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=float(value))
        shared = GaugeMetricFamily(PREFIX + "shared_in_flight", "leases of all replicas, last read", labels=["tenant"])
        fo = CounterMetricFamily(PREFIX + "fail_open_admitted", "admitted on the local limit while Redis was down",
                                 labels=["tenant"])
        fc = CounterMetricFamily(PREFIX + "fail_closed_deferred", "answered 503 because Redis was down",
                                 labels=["tenant"])
        for i, name in enumerate(b.names):
            shared.add_metric([name], float(b.shared[i]))
            fo.add_metric([name], float(s.fail_open_admitted[i]))
            fc.add_metric([name], float(s.fail_closed_deferred[i]))
        yield shared
        yield fo
        yield fc
        se = CounterMetricFamily(PREFIX + "redis_script_errors",
                                 "Redis calls answered with a script error (not outages: Redis stays up)",
                                 labels=["script"])
        for script, n in sorted(s.script_errors_by.items()):
            se.add_metric([script], float(n))
        yield se
        bad = CounterMetricFamily(PREFIX + "redis_bad_values",
                                  "values read from Redis that failed their check and were refused (the last "
                                  "good value stays)", labels=["kind"])
        for kind, n in sorted(s.bad_values_by.items()):
            bad.add_metric([kind], float(n))
        yield bad
        if self.contracts is not None:
            c = self.contracts
            co = CounterMetricFamily(PREFIX + "redis_contracts_fail_open",
                                     "requests classified on this replica's mirror of the contract envelope while "
                                     "Redis was down (or their script failed), failing open", labels=["tenant"])
            for i, name in enumerate(c.names):
                if c.contracts[i] is not None:
                    co.add_metric([name], float(c.fail_open_by[i]))
            yield co

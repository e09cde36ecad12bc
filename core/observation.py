"""The Observation: one schema, built from simulated telemetry and from live telemetry alike.

Flat-vector layout (``Observation.to_vector``), ``n`` = number of tenants::

    index                      feature                    unit
    0                          gpu_mem_util               fraction 0..1 (slot occupancy in the slot
                                                          engine; KV-cache usage in the token engine)
    1                          engine_running             requests executing in the engine
    2                          engine_waiting             requests admitted but waiting inside the engine
    3 + 17*i + 0               queue_depth                requests in tenant i's admission queue
    3 + 17*i + 1               in_flight                  tenant i's requests admitted and not finished
    3 + 17*i + 2               limit                      tenant i's current concurrency limit
    3 + 17*i + 3               arrivals                   arrivals in the telemetry window
    3 + 17*i + 4               completions                completions in the window
    3 + 17*i + 5               drops                      queue-timeout drops in the window
    3 + 17*i + 6               rejections                 queue-full rejections in the window
    3 + 17*i + 7 .. 9          e2e_p50, e2e_p95, e2e_p99  seconds, completions in the window
    3 + 17*i + 10 .. 12        ttft_p50, ttft_p95, ttft_p99  seconds (slot engine: queue wait)
    3 + 17*i + 13              samples                    completions behind the percentiles
    3 + 17*i + 14              queue_wait_p99             seconds waited in the admission queue
    3 + 17*i + 15              slo_e2e_p99                the tenant's e2e p99 objective, seconds
    3 + 17*i + 16              slo_ttft_p99               the tenant's TTFT p99 objective, seconds

Percentiles of an empty window are 0 with ``samples`` = 0. An SLO of "none" (infinite) is written as
``NO_SLO`` so that the vector stays finite. Every value is clipped to ``[0, FEATURE_MAX]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter

import numpy as np

NO_SLO = 1.0e4  # seconds, stands for "no objective" in the vector
FEATURE_MAX = 1.0e6

GLOBAL_FEATURES = ("gpu_mem_util", "engine_running", "engine_waiting")


@dataclass(slots=True)
class TenantObservation:
    queue_depth: float = 0.0
    in_flight: float = 0.0
    limit: float = 0.0
    arrivals: float = 0.0
    completions: float = 0.0
    drops: float = 0.0
    rejections: float = 0.0
    e2e_p50: float = 0.0
    e2e_p95: float = 0.0
    e2e_p99: float = 0.0
    ttft_p50: float = 0.0
    ttft_p95: float = 0.0
    ttft_p99: float = 0.0
    samples: float = 0.0
    queue_wait_p99: float = 0.0
    slo_e2e_p99: float = NO_SLO
    slo_ttft_p99: float = NO_SLO


TENANT_FEATURES = tuple(f.name for f in fields(TenantObservation))
_tenant_values = attrgetter(*TENANT_FEATURES)  # one C call per tenant instead of 17 getattr calls


def vector_from_values(values: list[float]) -> np.ndarray:
    """The flat float32 vector of the feature values in vector order, clipped to [0, FEATURE_MAX]."""
    vec = np.array(values, dtype=np.float32)
    # = np.clip(vec, 0, FEATURE_MAX), NaN included; np.clip's Python-level dispatch cost more than the work
    np.minimum(np.maximum(vec, 0.0, out=vec), FEATURE_MAX, out=vec)
    return vec


@dataclass(slots=True)
class Observation:
    """What a controller sees at one decision point."""

    time_s: float
    window_s: float
    gpu_mem_util: float
    engine_running: float
    engine_waiting: float
    tenants: list[TenantObservation]

    @property
    def n_tenants(self) -> int:
        return len(self.tenants)

    def to_vector(self) -> np.ndarray:
        vals = [self.gpu_mem_util, self.engine_running, self.engine_waiting]
        for t in self.tenants:
            vals.extend(_tenant_values(t))
        return vector_from_values(vals)

    @classmethod
    def from_vector(cls, vec: np.ndarray | Sequence[float], time_s: float = 0.0, window_s: float = 0.0) -> Observation:
        n_global = len(GLOBAL_FEATURES)
        per = len(TENANT_FEATURES)
        if (len(vec) - n_global) % per != 0:
            raise ValueError(f"vector of length {len(vec)} is not {n_global} global + k×{per} tenant features")
        tenants = []
        for i in range((len(vec) - n_global) // per):
            block = vec[n_global + i * per : n_global + (i + 1) * per]
            tenants.append(TenantObservation(*(float(x) for x in block)))
        return cls(time_s, window_s, float(vec[0]), float(vec[1]), float(vec[2]), tenants)

    @staticmethod
    def vector_size(n_tenants: int) -> int:
        return len(GLOBAL_FEATURES) + n_tenants * len(TENANT_FEATURES)

    @staticmethod
    def feature_names(tenant_names: list[str]) -> list[str]:
        names = list(GLOBAL_FEATURES)
        for tn in tenant_names:
            names.extend(f"{tn}.{f}" for f in TENANT_FEATURES)
        return names

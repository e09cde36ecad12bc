"""The Observation: one schema, built from simulated telemetry and from live telemetry alike.

Flat-vector layout (``Observation.to_vector``), layout version ``LAYOUT_VERSION`` = 2, ``n`` = number of
tenants, ``G`` = 5 global and ``T`` = 27 per-tenant features::

    index            feature                    unit
    0                gpu_mem_util               fraction 0..1 (slot occupancy in the slot engine; KV-cache usage
                                                in the token engine and live, vLLM's kv_cache_usage_perc)
    1                engine_running             requests executing in the engine
    2                engine_waiting             requests admitted but waiting inside the engine
    3                prefill_tokens_waiting     Σ over tenants of prefill_tokens (below)
    4                preemptions                engine preemptions in the telemetry window
    G + T*i + 0      queue_depth                requests in tenant i's admission queue
    G + T*i + 1      in_flight                  tenant i's requests admitted and not finished
    G + T*i + 2      limit                      tenant i's current concurrency limit
    G + T*i + 3      arrivals                   arrivals in the telemetry window
    G + T*i + 4      completions                completions in the window
    G + T*i + 5      drops                      queue-timeout drops in the window
    G + T*i + 6      rejections                 queue-full rejections in the window
    G + T*i + 7..9   e2e_p50, e2e_p95, e2e_p99  seconds, completions in the window
    G + T*i + 10..12 ttft_p50, ttft_p95, ttft_p99  seconds (slot engine: queue wait)
    G + T*i + 13     samples                    completions behind the percentiles
    G + T*i + 14     queue_wait_p99             seconds waited in the admission queue
    G + T*i + 15     slo_e2e_p99                the tenant's e2e p99 objective, seconds
    G + T*i + 16     slo_ttft_p99               the tenant's TTFT p99 objective, seconds
    G + T*i + 17     output_tokens_per_s        output tokens of the window's completions / window
    G + T*i + 18..19 tpot_p50, tpot_p99         seconds per output token after the first, completions
    G + T*i + 20     goodput                    good completions (within every per-request objective) / window
    G + T*i + 21..23 slo_ttft, slo_tpot, slo_e2e  the tenant's per-request objectives, seconds
    G + T*i + 24     prompt_tokens_queued       prompt tokens of its requests in the admission queue
    G + T*i + 25     prefill_tokens             prompt tokens of its admitted requests with no first token yet
    G + T*i + 26     tokens_in_flight           prompt + generated-so-far tokens of its admitted, unfinished
                                                requests (the footprint it holds in the KV cache, or will)

The token features are defined from what both worlds see of a request — its prompt size, whether its first
token came, how many tokens it has produced — so the simulator and the live gateway compute them the same
way (live: the gateway's prompt estimate, corrected by the backend's ``usage``, and the tokens it has
streamed; a non-streamed answer counts its tokens when it ends). Percentiles of an empty window are 0 with
``samples`` = 0. An SLO of "none" (infinite) is written as ``NO_SLO`` so that the vector stays finite.
Every value is clipped to ``[0, FEATURE_MAX]``.

**Versions.** Layout 1 was the first 3 global and 17 per-tenant features above (``3 + 17·n``), what the
first shipped policies were trained on. ``to_vector(layout=1)`` still builds it, which is the documented
adapter through which such a policy acts on a layout-2 world (agents/sb3_policy.py picks the layout from
the policy's input size and its config); any other size is refused with an error naming both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter

import numpy as np

NO_SLO = 1.0e4  # seconds, stands for "no objective" in the vector
FEATURE_MAX = 1.0e6
LAYOUT_VERSION = 2

GLOBAL_FEATURES = ("gpu_mem_util", "engine_running", "engine_waiting", "prefill_tokens_waiting", "preemptions")


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
    # layout 2: tokens, TPOT, goodput and the per-request objectives
    output_tokens_per_s: float = 0.0
    tpot_p50: float = 0.0
    tpot_p99: float = 0.0
    goodput: float = 0.0
    slo_ttft: float = NO_SLO
    slo_tpot: float = NO_SLO
    slo_e2e: float = NO_SLO
    prompt_tokens_queued: float = 0.0
    prefill_tokens: float = 0.0
    tokens_in_flight: float = 0.0


TENANT_FEATURES = tuple(f.name for f in fields(TenantObservation))
_tenant_values = attrgetter(*TENANT_FEATURES)  # one C call per tenant instead of 27 getattr calls
# layout version -> (global features, per-tenant features): each layout is a prefix of the next
LAYOUTS = {1: (GLOBAL_FEATURES[:3], TENANT_FEATURES[:17]), 2: (GLOBAL_FEATURES, TENANT_FEATURES)}
_v1_tenant_values = attrgetter(*TENANT_FEATURES[:17])


def layout_of(vector_size: int, n_tenants: int) -> int | None:
    """The layout whose vector for ``n_tenants`` has ``vector_size`` entries, or None."""
    for version, (g, t) in LAYOUTS.items():
        if len(g) + n_tenants * len(t) == vector_size:
            return version
    return None


def vector_from_values(values: list[float] | np.ndarray) -> np.ndarray:
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
    prefill_tokens_waiting: float = 0.0
    preemptions: float = 0.0

    @property
    def n_tenants(self) -> int:
        return len(self.tenants)

    def to_vector(self, layout: int = LAYOUT_VERSION) -> np.ndarray:
        """The flat vector in ``layout`` (the current one by default; 1 for policies trained on it)."""
        vals = [self.gpu_mem_util, self.engine_running, self.engine_waiting]
        if layout == LAYOUT_VERSION:
            vals += (self.prefill_tokens_waiting, self.preemptions)
            for t in self.tenants:
                vals.extend(_tenant_values(t))
        elif layout == 1:
            for t in self.tenants:
                vals.extend(_v1_tenant_values(t))
        else:
            raise ValueError(f"unknown observation layout {layout}; known: {', '.join(map(str, LAYOUTS))}")
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
        return cls(time_s, window_s, float(vec[0]), float(vec[1]), float(vec[2]), tenants, float(vec[3]),
                   float(vec[4]))

    @staticmethod
    def vector_size(n_tenants: int, layout: int = LAYOUT_VERSION) -> int:
        g, t = LAYOUTS[layout]
        return len(g) + n_tenants * len(t)

    @staticmethod
    def feature_names(tenant_names: list[str], layout: int = LAYOUT_VERSION) -> list[str]:
        g, t = LAYOUTS[layout]
        names = list(g)
        for tn in tenant_names:
            names.extend(f"{tn}.{f}" for f in t)
        return names

    @staticmethod
    def layout_index(n_tenants: int, layout: int) -> np.ndarray:
        """Where the features of ``layout`` sit in the current layout's vector (``vec[index]`` is it)."""
        g, t = LAYOUTS[layout]
        per = len(TENANT_FEATURES)
        idx = [GLOBAL_FEATURES.index(f) for f in g]
        for i in range(n_tenants):
            idx += [len(GLOBAL_FEATURES) + i * per + TENANT_FEATURES.index(f) for f in t]
        return np.asarray(idx, dtype=np.intp)

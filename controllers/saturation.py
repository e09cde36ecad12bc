"""Saturation gate (the Gateway API inference extension's default utilization detector).

One server, so the pool's saturation is that server's score::

    s = max(engine_waiting / 5, kv_usage / 0.8)
    s ≥ 1  →  every tenant's limit −max_step   (saturated: stop dispatching, shed back to the queues)
    s < 1  →  every tenant's limit +max_step   (headroom: dispatch, i.e. let the limits open up)

Inputs: ``engine_waiting`` (``vllm:num_requests_waiting``) and ``gpu_mem_util`` (``vllm:kv_cache_usage_perc``
on the token engine; on the slot engine it is slot occupancy, so the gate closes at 80% of the slots busy).
No latency input: the gate reads engine state only, which is why it reacts after the damage and
oscillates at a fixed threshold (GIE's documented flaws, PR #2062).
Source: kubernetes-sigs/gateway-api-inference-extension, release-1.5,
``pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization/README.md``.
"""

from __future__ import annotations

from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class SaturationGateController:
    name = "saturation"

    def __init__(self, waiting_threshold: float = 5.0, kv_threshold: float = 0.8) -> None:
        self.waiting_threshold, self.kv_threshold = waiting_threshold, kv_threshold

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.k = spec.limits.max_step

    def saturation(self, obs: Observation) -> float:
        return max(obs.engine_waiting / self.waiting_threshold, obs.gpu_mem_util / self.kv_threshold)

    def act(self, obs: Observation) -> list[int]:
        d = -self.k if self.saturation(obs) >= 1.0 else self.k
        return [d] * obs.n_tenants

"""The wire form of the shared words: ControlSpec and Observation to and from JSON.

The gateway's admin API answers ``GET /admin/spec`` with `spec_json` and ``GET /admin/observation`` with
`observation_json`; the live control loop (live/control.py) reads them back with `spec_from_json` and
`observation_from_json`, so a policy live gets the very objects the simulator hands it. Infinite
objectives travel as JSON null (strict JSON has no infinity).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
from admit.core.contract import Contract
from admit.core.observation import NO_SLO, Observation
from admit.core.spec import ControlSpec, Limits, TenantSpec


def observation_json(obs: Observation, names: Sequence[str], info: dict[str, Any]) -> dict[str, Any]:
    """The admin API's answer: the Observation's fields, its flat vector and the feature names."""
    return {
        "observation": {
            "time_s": obs.time_s, "window_s": obs.window_s, "gpu_mem_util": obs.gpu_mem_util,
            "engine_running": obs.engine_running, "engine_waiting": obs.engine_waiting,
            "prefill_tokens_waiting": obs.prefill_tokens_waiting, "preemptions": obs.preemptions,
            "tenants": [{"name": n, **asdict(t)} for n, t in zip(names, obs.tenants, strict=True)],
        },
        "vector": [float(x) for x in obs.to_vector()],
        "feature_names": Observation.feature_names(list(names)),
        "telemetry": info,
    }


def spec_json(spec: ControlSpec) -> dict[str, Any]:
    """A ControlSpec as JSON (``inf`` objectives as null); `spec_from_json` reads it back."""
    lim = spec.limits

    def fin(x: float) -> float | None:
        return None if math.isinf(x) else x

    return {
        "tenants": [{"name": t.name, "slo_e2e_p99_s": fin(t.slo_e2e_p99_s), "slo_ttft_p99_s": fin(t.slo_ttft_p99_s),
                     "weight": t.weight, "priority": t.priority, "slo_ttft_s": fin(t.slo_ttft_s),
                     "slo_tpot_s": fin(t.slo_tpot_s), "slo_e2e_s": fin(t.slo_e2e_s),
                     "max_limit": t.max_limit,
                     "contract": None if t.contract is None else t.contract.model_dump(exclude_none=True),
                     "contract_load": t.contract_load, "min_limit": t.min_limit} for t in spec.tenants],
        "limits": {"min": lim.min, "max": lim.max, "initial": lim.initial, "max_step": lim.max_step},
        "interval_s": spec.interval_s,
        "window_s": spec.window_s,
        "queue_timeout_s": fin(spec.queue_timeout_s),
    }


def spec_from_json(data: dict[str, Any]) -> ControlSpec:
    def inf(x: float | None) -> float:
        return math.inf if x is None else float(x)

    # the per-request objectives are absent from a gateway older than them: no objective
    tenants = tuple(TenantSpec(t["name"], inf(t["slo_e2e_p99_s"]), inf(t["slo_ttft_p99_s"]), float(t["weight"]),
                               int(t["priority"]), inf(t.get("slo_ttft_s")), inf(t.get("slo_tpot_s")),
                               inf(t.get("slo_e2e_s")), t.get("max_limit"),
                               None if t.get("contract") is None else Contract.model_validate(t["contract"]),
                               t.get("contract_load"), t.get("min_limit")) for t in data["tenants"])
    return ControlSpec(tenants, Limits(**data["limits"]), float(data["interval_s"]), float(data["window_s"]),
                       inf(data["queue_timeout_s"]))


def observation_from_json(data: dict[str, Any], spec: ControlSpec) -> Observation:
    """`observation_json`'s answer as the Observation the simulator would build for ``spec``'s tenants.

    The feature names must be those of ``spec``'s tenants (same names, same order), else ValueError; the
    SLO features are the spec's, the objectives the policy was reset with.
    """
    names = [t.name for t in spec.tenants]
    want = Observation.feature_names(names)
    if data["feature_names"] != want:
        got = data["feature_names"][:8]
        raise ValueError(f"the gateway's features do not match the spec's tenants {names}: {got}...")
    o = data["observation"]
    obs = Observation.from_vector(np.asarray(data["vector"], dtype=np.float32), o["time_s"], o["window_s"])
    for t, ts in zip(obs.tenants, spec.tenants, strict=True):
        t.slo_e2e_p99 = NO_SLO if math.isinf(ts.slo_e2e_p99_s) else ts.slo_e2e_p99_s
        t.slo_ttft_p99 = NO_SLO if math.isinf(ts.slo_ttft_p99_s) else ts.slo_ttft_p99_s
    return obs

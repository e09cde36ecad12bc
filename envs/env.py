"""TenantAdmission-v0: per-tenant admission concurrency in front of a simulated multi-tenant LLM server.

Registered as ``admit/TenantAdmission-v0`` when ``admit`` is imported::

    import admit, gymnasium
    env = gymnasium.make("admit/TenantAdmission-v0", scenario="seed-paper")

## Description
Several tenants send requests to one shared server (a slot engine or a token-level engine). In front of
the server, each tenant has an admission queue and a concurrency limit: at most ``limit`` of its
requests run at once, the rest wait in FIFO order and are dropped after the scenario's queue timeout.
Every ``interval_s`` seconds of simulated time the agent moves each tenant's limit.

## Observation space
``Box(0, 1e6, (3 + 17·n,), float32)`` for n tenants: three global features (GPU-memory utilisation,
requests running and waiting in the engine) and, per tenant, queue depth, in-flight, limit,
arrivals/completions/drops/rejections in the telemetry window, e2e and TTFT p50/p95/p99, sample count,
queue-wait p99 and the tenant's two SLOs. ``admit.core.observation`` documents the exact layout.

## Action space
``MultiDiscrete([2k+1] * n)``: entry a_i means a delta of ``a_i − k`` for tenant i (k = the scenario's
``limits.max_step``). New limits are clamped to ``[limits.min, limits.max]``.

## Reward
Per interval of length Δ: ``w_tp·completions/Δ − w_slo·slo_violations/Δ − w_drop·(drops+rejections)/Δ
− w_cost·Σ limits/(n·max) − w_change·Σ|delta|``, weights from the scenario's ``reward`` block. Every
term is also reported in ``info["reward_terms"]``.

## Episode end
Truncated when simulated time reaches ``horizon_s``; never terminated.

## Determinism
``reset(seed=s)`` draws the whole episode's workload from ``s``; the same seed and actions give the same
trajectory, and ``admit evaluate`` on seed s sees exactly the same requests.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from admit.core.observation import FEATURE_MAX, GLOBAL_FEATURES, TENANT_FEATURES, Observation, vector_from_values
from admit.envs.scenario import Scenario, load_scenario
from admit.envs.simulation import Simulation

_E2E_P99 = TENANT_FEATURES.index("e2e_p99")


class TenantAdmissionEnv(gym.Env[np.ndarray, np.ndarray]):
    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium convention)

    def __init__(self, scenario: str | Scenario = "seed-paper", render_mode: str | None = None) -> None:
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported; allowed: None")
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        self.spec_ = self.scenario.control_spec()
        self.n = len(self.scenario.tenants)
        self.k = self.scenario.limits.max_step
        self.action_space = gym.spaces.MultiDiscrete(np.full(self.n, 2 * self.k + 1, dtype=np.int64))
        size = Observation.vector_size(self.n)
        self.observation_space = gym.spaces.Box(0.0, FEATURE_MAX, shape=(size,), dtype=np.float32)
        self.sim: Simulation | None = None
        # the last observation as flat values; the Observation object is built only when asked for
        self._values: list[float] | None = None
        self._values_time = 0.0
        self._observation: Observation | None = None
        self._p99_index = [len(GLOBAL_FEATURES) + i * len(TENANT_FEATURES) + _E2E_P99 for i in range(self.n)]

    @property
    def last_observation(self) -> Observation | None:
        """The Observation behind the last vector returned (None before the first reset)."""
        if self._observation is None and self._values is not None:
            self._observation = Observation.from_vector(self._values, self._values_time, self.scenario.window_s)
        return self._observation

    def _observe(self) -> list[float]:
        assert self.sim is not None
        values = self.sim.observe_values()
        self._values, self._values_time, self._observation = values, self.sim.now, None
        return values

    # --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        episode_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self.sim = Simulation(self.scenario, episode_seed)
        info = {"episode_seed": episode_seed, "limits": self.sim.limits, "time_s": 0.0}
        return vector_from_values(self._observe()), info

    def _deltas(self, action: Any) -> list[int]:
        k = self.k
        # fast path: what a policy or a VecEnv passes (an integer array of the right shape), checked in Python
        if type(action) is np.ndarray and action.dtype.kind in "iu" and action.shape == (self.n,):
            vals = action.tolist()
            if min(vals) >= 0 and max(vals) <= 2 * k:
                return [v - k for v in vals]
        a = np.asarray(action)
        allowed = f"an integer array of shape ({self.n},) with values in 0..{2 * k} (delta = value − {k})"
        if a.shape != (self.n,):
            raise ValueError(f"action has shape {a.shape}; expected {allowed}")
        if not np.issubdtype(a.dtype, np.integer):
            if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
                raise ValueError(f"action {a.tolist()} is not integral; expected {allowed}")
            a = a.astype(np.int64)
        if a.min() < 0 or a.max() > 2 * k:
            raise ValueError(f"action {a.tolist()} is out of range; expected {allowed}")
        return (a.astype(np.int64) - k).tolist()

    def step(self, action: Any):
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        deltas = self._deltas(action)
        sim = self.sim
        sc = self.scenario
        before = sim.limits
        limits = sim.step(deltas)
        dt = sc.interval_s
        completions = violations = lost = 0
        for t in sim.take_interval_totals():
            completions += t.completed
            violations += t.slo_violations
            lost += t.dropped + t.rejected
        w = sc.reward
        terms = {
            "throughput": w.throughput * completions / dt,
            "slo_violation": -w.slo_violation * violations / dt,
            "drop": -w.drop * lost / dt,
            "cost": -w.cost * sum(limits) / (self.n * sc.limits.max),
            "change": -w.change * sum(abs(a - b) for a, b in zip(limits, before, strict=True)),
        }
        reward = float(sum(terms.values()))
        values = self._observe()
        truncated = sim.now >= sc.horizon_s - 1e-9
        info = {
            "reward_terms": terms,
            "limits": limits,
            "time_s": sim.now,
            "completions": completions,
            "drops": lost,
            "slo_violations": violations,
            "p99_s": max(values[j] for j in self._p99_index),
        }
        if truncated:
            info["episode_metrics"] = sim.summary()
        return vector_from_values(values), reward, False, truncated, info

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
from admit.core.observation import FEATURE_MAX, Observation
from admit.envs.scenario import Scenario, load_scenario
from admit.envs.simulation import Simulation


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
        self.last_observation: Observation | None = None

    # --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        episode_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self.sim = Simulation(self.scenario, episode_seed)
        obs = self.sim.observe()
        self.last_observation = obs
        return obs.to_vector(), {"episode_seed": episode_seed, "limits": self.sim.limits, "time_s": 0.0}

    def _deltas(self, action: Any) -> np.ndarray:
        a = np.asarray(action)
        allowed = f"an integer array of shape ({self.n},) with values in 0..{2 * self.k} (delta = value − {self.k})"
        if a.shape != (self.n,):
            raise ValueError(f"action has shape {a.shape}; expected {allowed}")
        if not np.issubdtype(a.dtype, np.integer):
            if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
                raise ValueError(f"action {a.tolist()} is not integral; expected {allowed}")
            a = a.astype(np.int64)
        if a.min() < 0 or a.max() > 2 * self.k:
            raise ValueError(f"action {a.tolist()} is out of range; expected {allowed}")
        return a.astype(np.int64) - self.k

    def step(self, action: Any):
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        deltas = self._deltas(action)
        sim = self.sim
        before = sim.limits
        limits = sim.apply_deltas(deltas.tolist())
        dt = self.scenario.interval_s
        sim.advance(min(sim.now + dt, self.scenario.horizon_s))
        totals = sim.take_interval_totals()
        w = self.scenario.reward
        completions = sum(t.completed for t in totals)
        violations = sum(t.slo_violations for t in totals)
        lost = sum(t.dropped + t.rejected for t in totals)
        terms = {
            "throughput": w.throughput * completions / dt,
            "slo_violation": -w.slo_violation * violations / dt,
            "drop": -w.drop * lost / dt,
            "cost": -w.cost * sum(limits) / (self.n * self.scenario.limits.max),
            "change": -w.change * sum(abs(a - b) for a, b in zip(limits, before, strict=True)),
        }
        reward = float(sum(terms.values()))
        obs = sim.observe()
        self.last_observation = obs
        truncated = sim.now >= self.scenario.horizon_s - 1e-9
        info = {
            "reward_terms": terms,
            "limits": limits,
            "time_s": sim.now,
            "completions": completions,
            "drops": lost,
            "slo_violations": violations,
            "p99_s": max(t.e2e_p99 for t in obs.tenants),
        }
        if truncated:
            info["episode_metrics"] = sim.summary()
        return obs.to_vector(), reward, False, truncated, info

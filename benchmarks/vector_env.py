"""Benchmark: env steps/s of N worlds, Gymnasium's SyncVectorEnv over N single envs against the native vector env.

    python benchmarks/vector_env.py [--scenario h200-mixed --scenario servegen-skewed ...] [--envs 64]
        [--steps 1800] [--rounds 3]

Per scenario, three ways to step N worlds: ``gymnasium.make_vec(id, num_envs=N)`` in ``vectorization_mode="sync"``
(Gymnasium's SyncVectorEnv over N ``TenantAdmissionEnv``: what the env offered before the native one), ``loop``
(N unwrapped ``TenantAdmissionEnv`` stepped in a plain Python loop: the least the single env costs per world),
and ``"vector_entry_point"`` (envs/vector.py: one kernel call for all N), each reset with seed 0 (world i: seed i)
and stepped ``--steps`` times with the same seeded random actions, timed from the first step: the autoresets
(a 30-minute episode is 900 steps, so each world resets once in the default 1,800) are in the figure, as in
training, the first reset is not. The three alternate inside
each round so machine noise hits both; the best round of each is reported with the ratio, and whether the two
returned the same rewards and observations (sums over the run, compared exactly). One process: one core.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import admit.envs  # noqa: F401  (registers the env ids)
import gymnasium as gym
import numpy as np
from admit.envs.compiled import warm
from admit.envs.env import TenantAdmissionEnv
from admit.envs.registration import ENV_ID

DEFAULT = ("h200-mixed", "servegen-skewed", "h200-mix@11000", "long-context-chat")


class _Loop:
    """N unwrapped ``TenantAdmissionEnv`` stepped in a Python loop, reset at truncation without a seed (as a
    vector env's autoreset does, one step later): the least today's single env costs per world."""

    def __init__(self, scenario: str, envs: int) -> None:
        self.envs = [TenantAdmissionEnv(scenario=scenario) for _ in range(envs)]
        self.ended = [False] * envs

    def reset(self, seed: int) -> None:
        for i, e in enumerate(self.envs):
            e.reset(seed=seed + i)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, None, None, None]:
        obs, rew = [], []
        for i, (e, a) in enumerate(zip(self.envs, actions, strict=True)):
            if self.ended[i]:
                o, _ = e.reset()
                r, self.ended[i] = 0.0, False
            else:
                o, r, _, self.ended[i], _ = e.step(a)
            obs.append(o)
            rew.append(r)
        return np.stack(obs), np.array(rew), None, None, None

    def close(self) -> None:
        pass


def _run(scenario: str, mode: str, envs: int, actions: np.ndarray) -> tuple[float, float, float]:
    env: Any = (_Loop(scenario, envs) if mode == "loop"
                else gym.make_vec(ENV_ID, num_envs=envs, vectorization_mode=mode, scenario=scenario))
    env.reset(seed=0)
    t0 = time.perf_counter()
    reward = obs = 0.0
    for a in actions:
        o, r, _, _, _ = env.step(a)
        reward += float(np.sum(r))
        obs += float(np.sum(o, dtype=np.float64))
    rate = envs * len(actions) / (time.perf_counter() - t0)
    env.close()
    return rate, reward, obs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", help=f"scenario (repeat); default: {', '.join(DEFAULT)}")
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1800, help="steps of the vector (each steps every world)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"kernels ready in {warm():.1f} s; load average {os.getloadavg()[0]:.2f}")
    print(f"N = {args.envs} worlds, {args.steps} steps each")
    print(f"{'scenario':20s} {'sync steps/s':>13s} {'loop steps/s':>13s} {'vector steps/s':>15s} {'/sync':>7s} "
          f"{'/loop':>7s}  identical")
    for scenario in args.scenario or DEFAULT:
        probe = gym.make_vec(ENV_ID, num_envs=args.envs, vectorization_mode="vector_entry_point", scenario=scenario)
        probe.action_space.seed(0)
        actions = np.stack([probe.action_space.sample() for _ in range(args.steps)])
        probe.close()
        best = {"sync": 0.0, "loop": 0.0, "vector_entry_point": 0.0}
        sums: dict[str, tuple[float, float]] = {}
        for _ in range(args.rounds):
            for mode in best:
                rate, reward, obs = _run(scenario, mode, args.envs, actions)
                best[mode] = max(best[mode], rate)
                sums[mode] = (reward, obs)
        same = sums["sync"] == sums["vector_entry_point"] == sums["loop"]
        v = best["vector_entry_point"]
        print(f"{scenario:20s} {best['sync']:13,.0f} {best['loop']:13,.0f} {v:15,.0f} {v / best['sync']:6.2f}x "
              f"{v / best['loop']:6.2f}x  {same}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

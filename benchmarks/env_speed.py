"""Benchmark: raw env steps/s with random actions, the Python world against the compiled one, side by side.

    python benchmarks/env_speed.py [--scenario h200-mixed --scenario servegen-skewed ...] [--steps 3000]
        [--rounds 3]

Per scenario and world: ``gym.make("admit/TenantAdmission-v1", scenario=..., world=...)``, the same seeded
random actions (``action_space.sample()`` after ``action_space.seed(0)``), resets at truncation on seeds
1, 2, ... (their cost is in the figure, as in training). The worlds alternate inside each round so machine
noise hits both; the best round per world is reported, with the ratio and whether the two worlds returned
the same rewards and observations (sums over the run, compared exactly). The compiled kernels are loaded
(or compiled) before timing. One process: one core.
"""

from __future__ import annotations

import argparse
import os
import time

import admit.envs  # noqa: F401  (registers the env ids)
import gymnasium as gym
import numpy as np
from admit.envs.compiled import warm

DEFAULT = ("h200-mixed", "servegen-skewed", "h200-mix@11000", "long-context-chat")


def _run(scenario: str, world: str, steps: int) -> tuple[float, float, float]:
    env = gym.make("admit/TenantAdmission-v1", scenario=scenario, world=world)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(steps)]
    t0 = time.perf_counter()
    env.reset(seed=0)
    reward = obs = 0.0
    episode = 0
    for a in actions:
        o, r, _, truncated, _ = env.step(a)
        reward += r
        obs += float(np.sum(o, dtype=np.float64))
        if truncated:
            episode += 1
            env.reset(seed=episode)
    return steps / (time.perf_counter() - t0), reward, obs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", help=f"scenario (repeat); default: {', '.join(DEFAULT)}")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"kernels ready in {warm():.1f} s; load average {os.getloadavg()[0]:.2f}")
    print(f"{'scenario':20s} {'python steps/s':>15s} {'compiled steps/s':>17s} {'ratio':>7s}  identical")
    for scenario in args.scenario or DEFAULT:
        best: dict[str, float] = {"python": 0.0, "compiled": 0.0}
        sums: dict[str, tuple[float, float]] = {}
        for _ in range(args.rounds):
            for world in ("python", "compiled"):
                rate, reward, obs = _run(scenario, world, args.steps)
                best[world] = max(best[world], rate)
                sums[world] = (reward, obs)
        same = sums["python"] == sums["compiled"]
        print(f"{scenario:20s} {best['python']:15,.0f} {best['compiled']:17,.0f} "
              f"{best['compiled'] / best['python']:6.1f}x  {same}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

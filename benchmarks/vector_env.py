"""Benchmark: env steps/s of N worlds, Gymnasium's SyncVectorEnv over N single envs against the native vector env.

    python benchmarks/vector_env.py [--scenario h200-mixed --scenario servegen-skewed ...] [--envs 64]
        [--steps 1800] [--rounds 3]
    python benchmarks/vector_env.py --ppo 65536 [--scenario ...] [--envs 64] [--rounds 2]

Per scenario, three ways to step N worlds: ``gymnasium.make_vec(id, num_envs=N)`` in ``vectorization_mode="sync"``
(Gymnasium's SyncVectorEnv over N ``TenantAdmissionEnv``: what the env offered before the native one), ``loop``
(N unwrapped ``TenantAdmissionEnv`` stepped in a plain Python loop: the least the single env costs per world),
and ``"vector_entry_point"`` (envs/vector.py: one kernel call for all N), each reset with seed 0 (world i: seed i)
and stepped ``--steps`` times with the same seeded random actions, timed from the first step: the autoresets
(a 30-minute episode is 900 steps, so each world resets once in the default 1,800) are in the figure, as in
training, the first reset is not. The three alternate inside
each round so machine noise hits both; the best round of each is reported with the ratio, and whether the two
returned the same rewards and observations (sums over the run, compared exactly). One process: one core.

``--ppo STEPS``: instead, ``admit train``'s PPO (an MLP policy on the env's own action) with ``vec_env`` dummy,
block (the trainer and one worker process: two cores) and worlds (the native vector env), env steps/s over
STEPS steps after the first rollout, best of ``--rounds``.
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


def _ppo(scenario: str, vec_env: str, envs: int, steps: int) -> float:
    """Env steps/s of ``admit train`` (PPO, MLP 64×64, n_steps 32 per env, minibatch 512, 2 epochs, no evaluation
    or checkpoints) on ``vec_env``, whole rollouts and updates, start-up excluded (the first rollout's time is
    taken off by timing ``steps`` more than a warm-up run of one rollout)."""
    import tempfile

    from admit.train.config import load_config
    from admit.train.trainer import train

    common = {"scenario": scenario, "n_envs": envs, "vec_env": vec_env, "vec_workers": 1, "eval": {"freq": 0},
              "checkpoint_freq": 0, "hyperparams": {"n_steps": 32, "batch_size": 512, "n_epochs": 2}}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        train(load_config(None, timesteps=32 * envs, **common), f"{tmp}/warm", progress=False)
        t1 = time.perf_counter()
        train(load_config(None, timesteps=32 * envs + steps, **common), f"{tmp}/run", progress=False)
        t2 = time.perf_counter()
    return steps / ((t2 - t1) - (t1 - t0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", help=f"scenario (repeat); default: {', '.join(DEFAULT)}")
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1800, help="steps of the vector (each steps every world)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ppo", type=int, default=0, metavar="STEPS",
                    help="instead: PPO env steps/s of admit train on vec_env dummy, block and worlds, STEPS timed")
    args = ap.parse_args()
    if args.ppo:
        print(f"kernels ready in {warm():.1f} s; load average {os.getloadavg()[0]:.2f}")
        print(f"PPO, N = {args.envs} envs, {args.ppo} env steps timed")
        for scenario in args.scenario or DEFAULT[:2]:
            best = {"dummy": 0.0, "block": 0.0, "worlds": 0.0}
            for _ in range(args.rounds):
                for vec in best:
                    best[vec] = max(best[vec], _ppo(scenario, vec, args.envs, args.ppo))
            print(f"{scenario:20s} " + "  ".join(f"{k} {v:,.0f}" for k, v in best.items())
                  + f"  worlds/dummy {best['worlds'] / best['dummy']:.2f}x  worlds/block "
                  f"{best['worlds'] / best['block']:.2f}x", flush=True)
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
        return
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

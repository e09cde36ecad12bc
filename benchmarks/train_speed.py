"""Benchmark: PPO training throughput on TenantAdmission-v0, DummyVecEnv vs SubprocVecEnv, 1–8 envs.

Every configuration trains the same PPO (the shipped policy's hyperparameters: 64×64 tanh MLP, rollout
of 2048 env steps per update split over the envs, batch 256, 5 epochs, VecNormalize, the TensorBoard
metrics callback; no evaluation or checkpoints) with ``torch.set_num_threads(1)``. Per configuration:
a warm-up ``learn`` (process start-up, torch's lazy imports), then ``--steps`` timed env steps. Reported:
wall-clock env steps/s, and env steps per CPU-second summed over the trainer and its env worker processes
(on a shared machine the CPU figure is the one that does not depend on what else runs). The raw env with
random actions and no policy is the ceiling. Configurations are interleaved over ``--repeat`` rounds so
machine noise hits all of them; the best round is reported.

    python benchmarks/train_speed.py [--scenario seed-paper] [--steps 16384] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import load_scenario
from admit.train.callbacks import EpisodeMetricsLogger
from admit.train.config import load_config
from admit.train.trainer import build_model, make_vec_env
from stable_baselines3.common.vec_env import SubprocVecEnv

CONFIGS = (("dummy", 1), ("dummy", 2), ("dummy", 4), ("dummy", 8), ("subproc", 2), ("subproc", 4), ("subproc", 8))
ROLLOUT = 2048
TICKS = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def raw_env(scenario: str, steps: int) -> tuple[float, float]:
    env = TenantAdmissionEnv(scenario)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2 * env.k + 1, size=(steps, env.n))
    env.reset(seed=1)
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(steps):
        _, _, _, truncated, _ = env.step(actions[i])
        if truncated:
            env.reset(seed=i)
    return steps / (time.perf_counter() - w0), steps / (time.process_time() - c0)


def ppo(scenario: str, vec_env: str, n_envs: int, steps: int) -> tuple[float, float]:
    cfg = load_config(
        None,
        scenario=scenario,
        n_envs=n_envs,
        vec_env=vec_env,
        hyperparams={"n_steps": ROLLOUT // n_envs, "batch_size": 256, "n_epochs": 5},
        eval={"freq": 0},
        checkpoint_freq=0,
    )
    venv = make_vec_env(cfg, load_scenario(scenario))
    try:
        model = build_model(cfg, venv, None)
        model.learn(ROLLOUT, callback=EpisodeMetricsLogger())  # warm-up
        base = venv.unwrapped
        workers = [p.pid for p in base.processes] if isinstance(base, SubprocVecEnv) else []
        c0 = time.process_time() + sum(_proc_cpu_s(p) for p in workers)
        w0 = time.perf_counter()
        model.learn(steps, callback=EpisodeMetricsLogger(), reset_num_timesteps=False)
        wall = time.perf_counter() - w0
        cpu = time.process_time() + sum(_proc_cpu_s(p) for p in workers) - c0
    finally:
        venv.close()
    return steps / wall, steps / cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="seed-paper")
    ap.add_argument("--steps", type=int, default=16384, help="timed env steps per configuration")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)
    print(f"scenario {args.scenario}, {args.steps} timed steps, cores {os.cpu_count()}, load {os.getloadavg()}")
    best: dict[str, tuple[float, float]] = {}
    for r in range(args.repeat):
        runs = [("raw env (random actions, no policy)", lambda: raw_env(args.scenario, args.steps))]
        for vec, n in CONFIGS:
            runs.append((f"PPO {vec} n_envs={n}", lambda v=vec, k=n: ppo(args.scenario, v, k, args.steps)))
        for name, run in runs:
            wall, cpu = run()
            print(f"round {r + 1}: {name:38s} {wall:8.0f} steps/s wall {cpu:8.0f} steps/CPU-s", flush=True)
            if name not in best or wall > best[name][0]:
                best[name] = (wall, cpu)
    print(f"\nbest of {args.repeat} rounds (load after: {os.getloadavg()})")
    print("| configuration | env steps/s (wall) | env steps per CPU-second |\n|---|---|---|")
    for name, (wall, cpu) in best.items():
        print(f"| {name} | {wall:,.0f} | {cpu:,.0f} |")


if __name__ == "__main__":
    main()

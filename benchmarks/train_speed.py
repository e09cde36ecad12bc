"""Benchmark: PPO training throughput on TenantAdmission-v1 — vec-env runners, env counts, minibatch sizes.

Every configuration trains PPO as ``admit train`` does (64×64 tanh MLP, 5 epochs, VecNormalize, the
TensorBoard episode-metrics callback, ``torch.set_num_threads(1)``, no evaluation or checkpoints) with a
rollout of 2048 env steps per update split over the envs (n_steps = 2048 / n_envs) and the minibatch size
given. Per configuration: a warm-up ``learn`` of one rollout (process and worker start-up, torch's lazy
imports), then ``--steps`` timed env steps. Reported per configuration:

- wall-clock env steps/s (on a shared machine: what was left of it);
- env steps per CPU-second, summing the trainer's and its env worker processes' CPU time;
- env steps per *trainer* CPU-second: the trainer process is the critical path (the policy, the PPO
  update, its own block of envs), so this is the wall speed bound where every other process has a core
  of its own — on an idle 2-core machine, for one trainer and one worker.

``--before REV`` also runs the old code's DummyVecEnv n_envs=8 configuration (and its raw env) from
``git archive REV`` in a subprocess, in the same rounds, so before and after are measured side by side.
Configurations are interleaved over ``--repeat`` rounds so machine noise hits all of them; the best round
(by CPU figure) is reported, with the load average before and after every round.

    python benchmarks/train_speed.py [--scenario seed-paper] [--steps 8192] [--repeat 2] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import load_scenario
from admit.train.callbacks import EpisodeMetricsLogger
from admit.train.config import load_config
from admit.train.trainer import build_model, env_factory, make_vec_env
from admit.train.vec import BlockVecEnv
from admit.train.wrappers import train_episode_seed_base
from revision_tree import extract
from stable_baselines3.common.vec_env import VecMonitor, VecNormalize

# (label, vec_env, n_envs, vec_workers, trainer_block, batch_size)
CONFIGS: tuple[tuple[str, str, int, int, bool, int], ...] = (
    ("dummy n_envs=8, batch 256 (shipped config)", "dummy", 8, 0, True, 256),
    ("subproc n_envs=8, batch 256", "subproc", 8, 0, True, 256),
    ("block n_envs=8, trainer + 1 worker, batch 256", "block", 8, 1, True, 256),
    ("dummy n_envs=32, batch 256", "dummy", 32, 0, True, 256),
    ("block n_envs=32, trainer + 1 worker, batch 256", "block", 32, 1, True, 256),
    ("block n_envs=32, 2 workers, batch 256", "block", 32, 2, False, 256),
    ("dummy n_envs=64, batch 1024", "dummy", 64, 0, True, 1024),
    ("block n_envs=64, trainer + 1 worker, batch 1024", "block", 64, 1, True, 1024),
)
ROLLOUT = 2048
TICKS = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def raw_env(scenario: str, steps: int) -> tuple[float, float, float]:
    env = TenantAdmissionEnv(scenario)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2 * env.k + 1, size=(steps, env.n))
    env.reset(seed=1)
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(steps):
        _, _, _, truncated, _ = env.step(actions[i])
        if truncated:
            env.reset(seed=i)
    cpu = steps / (time.process_time() - c0)
    return steps / (time.perf_counter() - w0), cpu, cpu


def ppo(scenario: str, vec_env: str, n_envs: int, workers: int, trainer_block: bool, batch: int, steps: int):
    cfg = load_config(
        None,
        scenario=scenario,
        n_envs=n_envs,
        vec_env=vec_env,
        vec_workers=workers,
        hyperparams={"n_steps": ROLLOUT // n_envs, "batch_size": batch, "n_epochs": 5},
        eval={"freq": 0},
        checkpoint_freq=0,
    )
    sc = load_scenario(scenario)
    if trainer_block:
        venv = make_vec_env(cfg, sc)
    else:  # the envs on the workers alone: the trainer process only runs the policy
        fns = [env_factory(sc, "multidiscrete", train_episode_seed_base(0, i), n_envs) for i in range(n_envs)]
        venv = VecNormalize(VecMonitor(BlockVecEnv(fns, workers=workers, trainer_block=False)), gamma=0.99)
    try:
        model = build_model(cfg, venv, None)
        model.learn(ROLLOUT, callback=EpisodeMetricsLogger())  # warm-up
        pids = [p.pid for p in getattr(venv.unwrapped, "processes", [])]
        t0, k0 = time.process_time(), sum(_proc_cpu_s(p) for p in pids)
        w0 = time.perf_counter()
        model.learn(steps, callback=EpisodeMetricsLogger(), reset_num_timesteps=False)
        wall = time.perf_counter() - w0
        trainer = time.process_time() - t0
        workers_cpu = sum(_proc_cpu_s(p) for p in pids) - k0
    finally:
        venv.close()
    return steps / wall, steps / (trainer + workers_cpu), steps / trainer


# the old tree's own benchmark functions, run from `git archive REV` (they return (wall, per CPU-second))
_BEFORE = """
import json, sys, torch
sys.path.insert(0, "{bench}")
import train_speed as b
torch.set_num_threads(1)
torch.distributions.Distribution.set_default_validate_args(False)
raw = b.raw_env("{scenario}", {steps})
ppo = b.ppo("{scenario}", "dummy", 8, {steps})
print(json.dumps({{"raw": raw, "ppo": ppo}}))
"""


def before(tree: Path, scenario: str, steps: int) -> dict[str, tuple[float, float, float]]:
    code = _BEFORE.format(bench=tree / "admit" / "benchmarks", scenario=scenario, steps=steps)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: (v[0], v[1], v[1]) for k, v in res.items()}


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="seed-paper")
    ap.add_argument("--steps", type=int, default=8192, help="timed env steps per configuration")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--before", metavar="REV", help="also measure the code at git revision REV (DummyVecEnv, 8 envs)")
    ap.add_argument("--only", action="append", help="run only configurations whose label contains this")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)
    print(f"scenario {args.scenario}, {args.steps} timed steps, cores {os.cpu_count()}, load {_load()}", flush=True)
    best: dict[str, tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tree = extract(args.before, Path(tmp)) if args.before else None
        for r in range(args.repeat):
            load0 = _load()
            results: list[tuple[str, tuple[float, float, float]]] = []
            if tree is not None:
                old = before(tree, args.scenario, args.steps)
                results += [(f"before ({args.before}): raw env", old["raw"])]
                results += [(f"before ({args.before}): PPO dummy n_envs=8, batch 256", old["ppo"])]
            results.append(("raw env (random actions, no policy)", raw_env(args.scenario, args.steps)))
            for label, *c in CONFIGS:
                if args.only and not any(o in label for o in args.only):
                    continue
                results.append((f"PPO {label}", ppo(args.scenario, *c, args.steps)))
                wall, cpu, trainer = results[-1][1]
                print(f"  {label:55s} {wall:7.0f} wall {cpu:7.0f} /CPU-s {trainer:7.0f} /trainer-CPU-s", flush=True)
            print(f"round {r + 1}: load {load0} -> {_load()}", flush=True)
            for name, res in results:
                if name not in best or res[1] > best[name][1]:
                    best[name] = res
    print(f"\nbest of {args.repeat} rounds by CPU figure (load at the end: {_load()})")
    print("| configuration | env steps/s (wall) | env steps per CPU-second | per trainer CPU-second |")
    print("|---|---|---|---|")
    for name, (wall, cpu, trainer) in best.items():
        print(f"| {name} | {wall:,.0f} | {cpu:,.0f} | {trainer:,.0f} |")


if __name__ == "__main__":
    main()

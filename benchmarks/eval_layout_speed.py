"""Benchmark: one validation evaluation of ppo:general's recipe, the episodes one env after another (the layout
before) against side by side (``admit.train.trainer.make_eval_env``), with the shipped model; alternating rounds.

    python benchmarks/eval_layout_speed.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import time

import torch
from admit.train.config import load_config
from admit.train.trainer import _factory, make_eval_env
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config("train/configs/ppo-general.yaml")
    model = PPO.load("agents/pretrained/ppo-general/model.zip", device="cpu")
    n = cfg.eval.episodes
    for r in range(args.rounds):
        one = VecNormalize(VecMonitor(DummyVecEnv([_factory(cfg, None, "validation", cfg.eval.seed_base, 1)])),
                           training=False, norm_obs=False, norm_reward=False)
        t = time.perf_counter()
        a, _ = evaluate_policy(model, one, n_eval_episodes=n, deterministic=True, return_episode_rewards=True)
        t_one = time.perf_counter() - t
        side = make_eval_env(cfg, None)
        t = time.perf_counter()
        b, _ = evaluate_policy(model, side, n_eval_episodes=n, deterministic=True, return_episode_rewards=True)
        t_side = time.perf_counter() - t
        print(f"round {r + 1}: {n} episodes one after another {t_one:.2f} s, side by side {t_side:.2f} s "
              f"(ratio {t_side / t_one:.3f}); the same returns: {sorted(a) == sorted(b)}, mean {sum(a) / n:.1f}")


if __name__ == "__main__":
    main()

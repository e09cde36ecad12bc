"""Shared set-up for the training tests: a short seed-paper scenario and a tiny training config."""

from __future__ import annotations

from pathlib import Path

import yaml
from admit.envs.scenario import load_scenario

# hyperparameters small enough that every algorithm updates its networks within a few hundred steps
TINY_HYPERPARAMS = {
    "ppo": {"n_steps": 64, "batch_size": 64, "n_epochs": 2},
    "a2c": {"n_steps": 8},
    "dqn": {"learning_starts": 100, "batch_size": 32, "target_update_interval": 100, "buffer_size": 2000},
    "sac": {"learning_starts": 100, "batch_size": 32, "buffer_size": 2000},
}


def short_scenario(folder: Path, horizon_s: float = 150.0) -> Path:
    """seed-paper cut to ``horizon_s`` (50 decisions per episode at 3 s), written as a YAML file."""
    data = load_scenario("seed-paper").model_dump(mode="json")
    data["horizon_s"] = horizon_s
    path = folder / "seed-paper-short.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tiny_config(folder: Path, algo: str, **extra: object) -> Path:
    data = {
        "hyperparams": TINY_HYPERPARAMS[algo],
        "policy": {"net_arch": [16, 16]},
        "eval": {"freq": 192, "episodes": 1},
        "checkpoint_freq": 128,
        **extra,
    }
    path = folder / f"tiny-{algo}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path

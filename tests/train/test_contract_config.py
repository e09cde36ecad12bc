"""train/configs/ppo-general-contract.yaml: the general policy on the contract-first reward loads as written (three
families, nothing tuned per scenario), its envs pay the contract term, and a few steps of it train."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from admit.train.config import load_config
from admit.train.worlds import SetEnv, Worlds
from typer.testing import CliRunner

from admit.cli import app

CONFIG = Path(__file__).resolve().parents[2] / "train" / "configs" / "ppo-general-contract.yaml"


def test_the_config_loads_with_the_contract_first_reward_and_no_tuning() -> None:
    cfg = load_config(CONFIG)
    assert cfg.family == ["h200-mix", "h200-shift", "h200-drift"]
    assert cfg.policy.kind == "tenant-set" and cfg.policy.anchor == "none"  # never sees tuned caps
    assert cfg.imitation is None and cfg.family_pool is None and cfg.paired_reward is None  # nothing tuned first
    assert cfg.reward is not None
    assert cfg.reward.weights() == {"throughput": 0.0, "goodput": 1.0, "slo_violation": 0.0, "drop": 0.0,
                                    "contract_miss": 4.0}
    assert cfg.reward_per_offered_load


def test_its_envs_pay_for_contract_misses_on_every_family() -> None:
    cfg = load_config(CONFIG)
    assert cfg.reward is not None and isinstance(cfg.family, list)
    env = SetEnv(Worlds(family=tuple(cfg.family), reward=cfg.reward.weights()), cfg.reward_per_offered_load)
    seen = set()
    for seed in range(12):
        _, info = env.reset(seed=1_000_000 + seed)
        seen.add(info["world"].split("@")[0])
        assert env.inner is not None and env.inner.scenario.has_contracts
        assert env.inner.scenario.reward.contract_miss == 4.0
        for _ in range(3):
            _, reward, _, _, info = env.step(np.full(env.max_tenants, 3))  # hold
            assert "contract_misses" in info and info["reward_terms"]["contract_miss"] <= 0.0
            assert reward == pytest.approx(sum(info["reward_terms"].values()), abs=1e-12)
    assert seen == {"h200-mix", "h200-shift", "h200-drift"}


def test_a_few_steps_of_it_train(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = ["n_envs=2", "vec_env=dummy", "update_threads=null", "policy.hidden=8", "hyperparams.n_steps=32",
            "hyperparams.batch_size=32", "hyperparams.n_epochs=1", "eval.freq=0", "checkpoint_freq=0"]
    result = CliRunner().invoke(app, ["train", "--config", str(CONFIG), "--timesteps", "64", "--out", str(out),
                                      "--no-progress", *(a for s in sets for a in ("--set", s))])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["timesteps"] == 64
    assert summary["scenario"] == "h200-mix@0-9999 + h200-shift@0-9999 + h200-drift@0-9999 (train)"
    assert (out / "model.zip").is_file()

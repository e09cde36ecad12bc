"""Imitation of static:best's caps (admit.train.imitation): the expert's choice and a DAgger run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from admit.agents import set_codec
from admit.agents.set_policy import TenantSetPolicy
from admit.agents.static_best import all_stores, tuned_caps
from admit.core.spec import Limits
from admit.envs.scenario import load_scenario
from admit.train import worlds
from admit.train.imitation import expert_choices
from admit.train.static_search import SEARCH_SEEDS
from admit.train.worlds import SetEnv, Worlds, pool_caps
from stable_baselines3 import PPO
from typer.testing import CliRunner

from admit.cli import app

F = {f: i for i, f in enumerate(set_codec.FACTORS)}


def test_the_expert_moves_each_limit_as_near_its_cap_as_one_decision_goes() -> None:
    lim = Limits(min=1, max=512, initial=64, max_step=16)
    # far above: the biggest cut max_step allows (x0.5 and x0.75 both reach 48: the smaller move wins)
    assert expert_choices([64], [1], lim) == [F[0.75]]
    assert expert_choices([8], [1], lim) == [F[0.5]]  # 8 -> 4: nearest 1
    assert expert_choices([12, 12], [12, 13], lim) == [set_codec.HOLD, F[1.1]]  # at the cap: hold; one below: +1
    assert expert_choices([100], [130], lim) == [F[1.33]]  # 100 -> 116 (clipped) beats 110
    with pytest.raises(ValueError, match="2 limits and 1 caps"):
        expert_choices([1, 2], [1], lim)


def test_pool_caps_on_fewer_seeds_are_cached_apart_from_static_best(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Imitation's cheaper targets (imitation.search_seeds < 5) are tuned on a prefix of static:best's seeds, kept in
    their own file and read back from it, and never seen by static:best's lookup; on all 5 seeds they are
    static:best's caps themselves."""
    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path))
    sc = load_scenario("h200-live-small")
    one = pool_caps(sc, SEARCH_SEEDS[:1], workers=1)
    assert one.seeds == SEARCH_SEEDS[:1] and len(one.caps) == len(sc.tenants)
    path = worlds.pool_path(sc, SEARCH_SEEDS[:1])
    assert one.path == path and path.exists()
    assert all(st.path != path for st in all_stores())  # static:best never deploys it
    stamp = path.stat().st_mtime_ns
    worlds._POOL.clear()
    again = pool_caps(sc, SEARCH_SEEDS[:1], workers=1)
    assert again.caps == one.caps and path.stat().st_mtime_ns == stamp  # read back, not tuned again
    assert pool_caps(sc).caps == tuned_caps(sc).caps
    with pytest.raises(ValueError, match="non-empty prefix of 900000..900004"):
        pool_caps(sc, (900_001,))


def _episode_limits(model: PPO, env: SetEnv, seed: int) -> list[int]:
    obs, _ = env.reset(seed=seed)
    done, info = False, {}
    while not done:
        with torch.no_grad():
            act = model.policy.get_distribution(torch.as_tensor(obs[None])).mode()[0].numpy()
        obs, _, te, tr, info = env.step(act)
        done = te or tr
    return list(info["limits"])


def test_imitation_teaches_the_policy_the_tuned_caps(tmp_path: Path) -> None:
    """Without imitation the (near-uniform) policy's mode wanders; after it, the deployed policy ends an unseen
    episode at static:best's caps (12, 12 from 4 on h200-live-small), never having seen them in its input."""
    sc = load_scenario("h200-live-small")
    caps = list(tuned_caps(sc).caps)
    cfg = tmp_path / "imitate.yaml"
    cfg.write_text(yaml.safe_dump({
        "scenario": "h200-live-small", "timesteps": 0, "n_envs": 1,
        "policy": {"kind": "tenant-set", "hidden": 16},
        "imitation": {"rounds": 2, "episodes": 4, "dagger_episodes": 2, "epochs": 40, "batch_size": 32},
        "eval": {"freq": 0}, "checkpoint_freq": 0,
    }))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(cfg), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "imitation round 1:" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["timesteps"] == 0 and [r["round"] for r in summary["imitation"]] == [0, 1]
    assert summary["imitation"][1]["samples"] > summary["imitation"][0]["samples"]
    env = SetEnv(Worlds(scenario=sc))
    assert not set_codec.anchored_of(env.observation_space.shape[0])  # the caps are not in its input
    learned = _episode_limits(PPO.load(str(out / "model.zip"), device="cpu"), env, seed=77)
    torch.manual_seed(0)
    fresh = PPO(TenantSetPolicy, env, n_steps=32, batch_size=32, device="cpu", policy_kwargs={"hidden": 16})
    untrained = _episode_limits(fresh, env, seed=77)

    def off(limits: list[int]) -> float:  # how far from the caps, in log terms (a factor of 2 is 0.69)
        return float(sum(abs(np.log(lim / cap)) for lim, cap in zip(limits, caps, strict=True)))

    start = [sc.limits.initial] * len(caps)
    assert off(learned) < off(start) / 3 and off(learned) < off(untrained), (learned, untrained, caps)

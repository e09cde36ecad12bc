"""The anchored tenant-set policy: one network acting around static:best's tuned caps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from admit.agents import set_codec
from admit.agents.registry import make_controller
from admit.agents.sb3_policy import SB3Policy
from admit.agents.set_policy import TenantSetPolicy
from admit.agents.static_best import tuned_caps
from admit.controllers.around import AroundBase
from admit.core.spec import Limits
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import run_policy
from admit.train.worlds import SetEnv, Worlds
from gymnasium.utils.env_checker import check_env
from stable_baselines3 import PPO
from typer.testing import CliRunner

from admit.cli import app

LIMITS = Limits(min=1, max=512, initial=64, max_step=16)
F = {f: i for i, f in enumerate(set_codec.FACTORS)}


def test_anchored_choices_are_targets_around_the_anchor_not_steps_from_the_limit() -> None:
    hold = set_codec.HOLD
    # hold: towards the anchor by at most max_step, from above and below, and nothing once there
    assert set_codec.anchored_delta_list([hold, hold, hold], [64, 10, 40], [8, 40, 40], LIMITS) == [-16, 16, 0]
    # a factor is a target relative to the anchor, whatever the limit is now (non-cumulative)
    assert set_codec.anchored_delta_list([F[2.0], F[2.0]], [40, 80], [40, 40], LIMITS) == [16, 0]
    assert set_codec.anchored_delta_list([F[0.5]], [40], [40], LIMITS) == [-16]
    # at least one away from the anchor when the factor is not 1; clipped to the bounds
    assert set_codec.anchored_delta_list([F[1.1], F[0.9]], [2, 2], [2, 2], LIMITS) == [1, -1]
    assert set_codec.anchored_delta_list([F[0.5], F[2.0]], [1, 512], [1, 512], LIMITS) == [0, 0]
    with pytest.raises(ValueError, match="2 choices and 1 anchors for 2 tenants"):
        set_codec.anchored_delta_list([hold, hold], [4, 4], [4], LIMITS)
    with pytest.raises(ValueError, match="anchors must be 2 caps within the limits 1..512"):
        set_codec.set_vector(np.zeros(5 + 2 * set_codec.N_TENANT, dtype=np.float32), 2, LIMITS, anchors=[4, 600])
    vec = set_codec.set_vector(np.zeros(5 + 2 * set_codec.N_TENANT, dtype=np.float32), 2, LIMITS, anchors=[4, 9])
    assert vec.shape == (set_codec.set_vector_size(anchored=True),)
    assert list(vec[-set_codec.MAX_TENANTS :][:3]) == [4, 9, 0]
    assert set_codec.anchored_of(vec.size) and not set_codec.anchored_of(set_codec.set_vector_size())
    with pytest.raises(ValueError, match="a tenant-set input for 8 slots has"):
        set_codec.anchored_of(vec.size + 1)


def test_holding_the_anchors_is_static_best_step_for_step() -> None:
    """The anchored env, told "hold" at every decision, runs the episode static:best runs: same ramp from the
    initial caps, same limits, same goodput."""
    sc = load_scenario("h200-mixed")
    caps = list(tuned_caps(sc).caps)
    env = SetEnv(Worlds(scenario=sc, anchored=True))
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=7)
    assert env.anchors == caps and list(obs[-set_codec.MAX_TENANTS:][: len(caps)]) == caps
    hold = np.full(set_codec.MAX_TENANTS, set_codec.HOLD)
    limits, done, info = [], False, {}
    while not done:
        _, _, term, trunc, info = env.step(hold)
        limits.append(list(info["limits"]))
        done = term or trunc
    best = run_policy(sc, "static:best", seed=7)
    assert limits[-1] == caps and limits[0] != caps  # it ramped from the initial caps to the tuned ones
    assert info["episode_metrics"]["goodput_rps"] == best["goodput_rps"]
    assert info["episode_metrics"]["completed"] == best["completed"]


def test_an_untrained_anchored_policy_holds_and_a_trained_one_deploys_with_static_bests_caps(tmp_path: Path) -> None:
    env = SetEnv(Worlds(scenario=load_scenario("h200-mixed"), anchored=True))
    torch.manual_seed(0)
    policy = PPO(TenantSetPolicy, env, n_steps=32, batch_size=32, device="cpu",
                 policy_kwargs={"hidden": 8, "hold_bias": 4.0}).policy
    assert isinstance(policy, TenantSetPolicy) and policy.anchored
    obs, _ = env.reset(seed=0)
    with torch.no_grad():
        dist = policy.get_distribution(torch.as_tensor(obs[None]))
    assert (dist.mode() == set_codec.HOLD).all() and (dist.probs[0, :, set_codec.HOLD] > 0.85).all()

    cfg = tmp_path / "anchored.yaml"
    cfg.write_text(yaml.safe_dump({
        "scenario": "h200-live-small",
        "policy": {"kind": "tenant-set", "hidden": 8, "anchor": "tuned", "hold_bias": 8.0},
        "hyperparams": {"n_steps": 32, "batch_size": 32, "n_epochs": 1},
        "timesteps": 64, "n_envs": 2, "eval": {"freq": 0}, "checkpoint_freq": 0,
    }))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(cfg), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    sc = load_scenario("h200-live-small")
    controller = make_controller(f"ppo:{out}", scenario=sc)
    assert isinstance(controller, AroundBase) and controller.name == f"ppo:{out}"  # around static:best's caps
    assert isinstance(controller.inner, SB3Policy) and controller.inner.anchored
    ep, best = run_policy(sc, f"ppo:{out}", seed=3), run_policy(sc, "static:best", seed=3)
    # 64 steps leave "hold" the mode everywhere: the deployed policy is static:best, caps found the same way
    assert ep["goodput_rps"] == best["goodput_rps"] and ep["completed"] == best["completed"]
    bare = SB3Policy("ppo", str(out))
    with pytest.raises(ValueError, match="acts around tuned caps and was given none"):
        bare.reset(sc.control_spec(), 3)


def test_a_family_pool_draws_only_its_first_seeds() -> None:
    worlds = Worlds(family="h200-mix", split="validation", pool=3)
    assert worlds.seeds() == range(10_000, 10_003)
    drawn = {worlds.pick(s).name for s in range(500_000, 500_040)}
    assert drawn == {"h200-mix@10000", "h200-mix@10001", "h200-mix@10002"}
    with pytest.raises(ValueError, match="pool must be 1..1000 instances of h200-mix's validation seeds"):
        Worlds(family="h200-mix", split="validation", pool=1001)

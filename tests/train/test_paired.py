"""The paired reward (admit.train.worlds.Paired), the wide anchored choices and training across several families:
what the anchored ppo:general is trained with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from admit.agents import set_codec
from admit.agents.registry import make_controller
from admit.agents.sb3_policy import SB3Policy
from admit.agents.static_best import tuned_caps
from admit.controllers.around import AroundBase
from admit.controllers.static import StaticController
from admit.core.spec import Limits
from admit.envs.compiled import CompiledSimulation
from admit.envs.kernels import T_ARRIVED, T_GOOD
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import run_policy
from admit.train.config import TrainConfigError, load_config
from admit.train.static_search import SEARCH_SEEDS
from admit.train.worlds import Paired, SetEnv, Worlds
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

from admit.cli import app

LIMITS = Limits(min=1, max=512, initial=64, max_step=16)
W = {f: i for i, f in enumerate(set_codec.WIDE_FACTORS)}


def test_a_recorded_run_gives_the_totals_of_stepping_the_same_rule_by_hand() -> None:
    sc = load_scenario("h200-mix@11002").model_copy(update={"horizon_s": 300.0})
    caps = [1, 1, 1, 24, 32, 64, 64, 64]
    rule = StaticController(caps)
    rule.reset(sc.control_spec(), 3)
    recorded = CompiledSimulation(sc, 3).run_recorded(rule)
    by_hand = CompiledSimulation(sc, 3)
    rows = []
    while not by_hand.done:
        by_hand.step(rule.act(by_hand.observe()))
        rows.append(np.array([[t.arrived, t.completed, t.dropped, t.rejected, t.slo_violations, t.good,
                               t.output_tokens] for t in by_hand.totals]))
    assert recorded.shape == (150, 8, 7)
    assert np.array_equal(recorded, np.array(rows))
    assert recorded[-1, :, T_GOOD].sum() > 0 and recorded[-1, :, T_ARRIVED].sum() > recorded[0, :, T_ARRIVED].sum()
    with pytest.raises(ValueError, match="run_recorded needs a controller that decides by a built-in rule"):
        CompiledSimulation(sc, 3).run_recorded(make_controller("aimd"))


def test_wide_choices_are_whole_steps_around_the_anchor() -> None:
    wide = set_codec.WIDE_FACTORS
    assert wide.index(1.0) == set_codec.HOLD and len(wide) == len(set_codec.FACTORS)
    # an anchor of 1 lent eight slots in one choice, reached by max_step a decision
    assert set_codec.anchored_delta_list([W[8.0]], [1], [1], LIMITS, wide) == [7]
    assert set_codec.anchored_delta_list([W[8.0]], [1], [4], LIMITS, wide) == [16]
    assert set_codec.anchored_delta_list([W[0.25], W[2.0]], [40, 40], [40, 40], LIMITS, wide) == [-16, 16]
    assert set_codec.anchored_delta_list([W[0.25], W[8.0]], [1, 512], [1, 300], LIMITS, wide) == [0, 0]
    # the narrow set reads the same choice index as another factor
    assert set_codec.anchored_delta_list([6], [1], [1], LIMITS) == [1]
    with pytest.raises(ValueError, match="factor set 'huge' is unknown; allowed: narrow, wide"):
        set_codec.factor_set("huge")


def test_holding_earns_exactly_nothing_and_a_deviation_earns_its_paired_difference() -> None:
    """Holding the anchors replays the anchors' own episode, so every paired reward is 0.0; a policy that
    deviates earns, over the episode, its good requests less the anchors' on the same requests, each tenant short of
    the anchors' count costing ``1 + tenant_penalty`` per request: the episode's rewards sum to that figure."""
    sc = load_scenario("h200-live-small")
    env = SetEnv(Worlds(scenario=sc, anchored=True), per_offered_load=False, factors="wide", paired=Paired(4.0))
    check_env(env, skip_render_check=True)
    hold = np.full(set_codec.MAX_TENANTS, set_codec.HOLD)
    env.reset(seed=11)
    rewards, done = [], False
    while not done:
        _, r, term, trunc, info = env.step(hold)
        rewards.append(r)
        done = term or trunc
    assert rewards and all(r == 0.0 for r in rewards)

    lend = hold.copy()
    lend[0], lend[1] = W[0.25], W[8.0]  # cut one tenant to a quarter of its cap, lend the other eight times its cap
    env.reset(seed=11)
    total, done, terms = 0.0, False, {"paired_goodput": 0.0, "tenant_shortfall": 0.0}
    while not done:
        _, r, term, trunc, info = env.step(lend)
        total += r * sc.interval_s
        for k in terms:
            terms[k] += info["reward_terms"][k] * sc.interval_s
        done = term or trunc
    assert env.inner is not None and env.inner.sim is not None
    mine = {n: v["good"] for n, v in env.inner.sim.tenant_summary().items()}
    best = {n: v["good"] for n, v in run_policy(sc, "static:best", seed=11)["tenants"].items()}
    diff = np.array([mine[n] - best[n] for n in best])
    assert diff[0] < 0  # the cut tenant is short of its anchors' count: its penalty is in the sum
    assert total == pytest.approx(diff.sum() + 4.0 * np.minimum(diff, 0).sum(), abs=1e-9)
    assert terms["paired_goodput"] == pytest.approx(diff.sum(), abs=1e-9)
    assert terms["tenant_shortfall"] == pytest.approx(4.0 * np.minimum(diff, 0).sum(), abs=1e-9)


def test_a_tolerance_frees_small_shortfalls_of_the_penalty() -> None:
    diff, arrived = np.array([-5.0, 3.0, -30.0]), np.array([1000.0, 100.0, 1000.0])
    assert Paired(4.0).potential(diff, arrived) == -32.0 + 4.0 * -35.0
    # 1 % of 1000 arrivals: 5 short is free, 30 short costs its 20 beyond the allowance
    assert Paired(4.0, 0.01).potential(diff, arrived) == -32.0 + 4.0 * -20.0
    with pytest.raises(ValueError, match=r"tolerance must be in \[0, 0.1\]"):
        Paired(4.0, 0.5)


def test_the_paired_reward_and_wide_choices_need_anchors() -> None:
    sc = load_scenario("h200-live-small")
    with pytest.raises(ValueError, match="the paired reward compares the policy with its anchors"):
        SetEnv(Worlds(scenario=sc), paired=Paired())
    with pytest.raises(ValueError, match="factors 'wide': only an anchored policy"):
        SetEnv(Worlds(scenario=sc), factors="wide")
    with pytest.raises(ValueError, match=r"tenant_penalty must be in \[0, 100\]"):
        Paired(-1.0)
    for sets, match in ((["paired_reward.tenant_penalty=2"], "paired_reward compares the policy with its anchors"),
                        (["policy.anchor_factors=wide"], "policy.anchor_factors: only an anchored policy"),
                        (["family=[h200-mix, h200-mix]", "policy.kind=tenant-set"], "name each family once")):
        with pytest.raises(TrainConfigError, match=match):
            load_config(None, sets)
    with pytest.raises(TrainConfigError, match="policy.anchor_factors"):
        load_config(None, ["policy.anchor_factors=huge"])


def test_several_families_share_one_pool_of_episodes() -> None:
    worlds = Worlds(family=("h200-mix", "h200-shift"), split="validation", pool=2, anchored=True, search_seeds=2)
    assert Worlds(family="h200-mix+h200-shift", split="validation", pool=2) .families == ("h200-mix", "h200-shift")
    assert worlds.names() == ["h200-mix@10000", "h200-mix@10001", "h200-shift@10000", "h200-shift@10001"]
    drawn = {worlds.pick(s).name for s in range(500_000, 500_060)}
    assert drawn == set(worlds.names())
    assert worlds.describe() == "h200-mix@10000-10001 + h200-shift@10000-10001 (validation)"
    # one family draws as it always did (the same instance for the same episode seed)
    one = Worlds(family="h200-mix", split="validation", pool=3)
    assert [one.pick(s).name for s in range(500_000, 500_006)] == \
        [f"h200-mix@{10_000 + int(np.random.default_rng([s, 0x5E7]).integers(0, 3))}" for s in range(500_000, 500_006)]
    with pytest.raises(ValueError, match="name each family once"):
        Worlds(family=("h200-mix", "h200-mix"))
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        Worlds(family="h200-mix+nope")
    with pytest.raises(ValueError, match="search_seeds must be 1..5"):
        Worlds(family="h200-mix", search_seeds=6)


def test_a_wide_anchored_policy_deploys_with_its_own_choice_set(tmp_path: Path) -> None:
    """The choice set is part of the saved policy: deployed, a choice means what it meant in training."""
    cfg = tmp_path / "wide.yaml"
    cfg.write_text(yaml.safe_dump({
        "scenario": "h200-live-small",
        "policy": {"kind": "tenant-set", "hidden": 8, "anchor": "tuned", "anchor_factors": "wide", "hold_bias": 8.0},
        "paired_reward": {"tenant_penalty": 4.0},
        "hyperparams": {"n_steps": 32, "batch_size": 32, "n_epochs": 1},
        "timesteps": 64, "n_envs": 2, "eval": {"freq": 0}, "checkpoint_freq": 0,
    }))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(cfg), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    sc = load_scenario("h200-live-small")
    wrapped = make_controller(f"ppo:{out}", scenario=sc)
    assert isinstance(wrapped, AroundBase)  # it acts around static:best's caps
    ctrl = wrapped.inner
    assert isinstance(ctrl, SB3Policy) and ctrl.anchored
    assert ctrl.model.policy.set_factors == "wide"
    wrapped.reset(sc.control_spec(), 3)
    caps = list(tuned_caps(sc).caps)
    assert ctrl.anchors == caps
    with torch.no_grad():  # make "×8" every slot's choice
        ctrl.model.policy.action_net.out.bias.copy_(torch.tensor([0, 0, 0, 0, 0, 0, 50.0]))
    obs = CompiledSimulation(sc, 3).observe()
    lim = sc.limits
    assert ctrl.act(obs) == [max(-lim.max_step, min(lim.max_step, min(lim.max, 8 * c) - int(t.limit)))
                             for c, t in zip(caps, obs.tenants, strict=True)]
    with torch.no_grad():  # and "×¼"
        ctrl.model.policy.action_net.out.bias.copy_(torch.tensor([50.0, 0, 0, 0, 0, 0, 0]))
    assert ctrl.act(obs) == [max(-lim.max_step, min(lim.max_step, max(lim.min, round(c / 4)) - int(t.limit)))
                             for c, t in zip(caps, obs.tenants, strict=True)]


def test_a_pool_tuned_one_instance_per_process_has_the_caps_of_one_search_at_a_time(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    from admit.train.worlds import pool_caps, search_pool

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "envs/families/h200-shift.yaml").read_text())
    data["scenario"]["horizon_s"] = 240  # short episodes: a quick search
    fam = tmp_path / "short-shift.yaml"
    fam.write_text(yaml.safe_dump(data))
    worlds = Worlds(family=str(fam), split="validation", pool=2, anchored=True, search_seeds=1)
    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path / "a"))
    parallel = search_pool(worlds, workers=2, search_seeds=1)
    assert len(list((tmp_path / "a" / "pool_caps").glob("*.json"))) == 2  # the processes wrote them
    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path / "b"))
    one = {sc.name: list(pool_caps(sc, SEARCH_SEEDS[:1], workers=1).caps)
           for sc in (worlds.instance(s, str(fam)) for s in worlds.family_seeds(str(fam)))}
    assert parallel == one and len(one) == 2


def _anchors_in_child(scenario, queue) -> None:  # type: ignore[no-untyped-def]
    from admit.train.worlds import anchors_for

    try:
        queue.put(anchors_for(scenario, 1))
    except BaseException as e:  # the parent's assertion shows what went wrong
        queue.put(repr(e))


def test_an_env_in_a_daemonic_worker_tunes_an_untuned_instance_itself(tmp_path: Path, monkeypatch) -> None:
    """A vector env's worker is a daemonic process, which may not start a process pool: an instance nobody
    tuned before must still get its caps there (tuned in that process), the caps of the same search anywhere."""
    import multiprocessing

    from admit.train.worlds import pool_caps

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "envs/families/h200-shift.yaml").read_text())
    data["scenario"]["horizon_s"] = 240
    fam = tmp_path / "short-shift.yaml"
    fam.write_text(yaml.safe_dump(data))
    worlds = Worlds(family=str(fam), split="validation", pool=1)
    sc = worlds.instance(worlds.family_seeds(str(fam)).start, str(fam))
    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("ADMIT_SEARCH_WORKERS", "2")  # what would start a pool, were it not a daemon
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_anchors_in_child, args=(sc, queue), daemon=True)
    child.start()
    got = queue.get(timeout=600)
    child.join()
    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path / "b"))
    assert got == list(pool_caps(sc, SEARCH_SEEDS[:1], workers=1).caps)

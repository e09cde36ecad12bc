"""SB3 policies as Controllers: the action codec, the shipped PPO policy, lazy torch import, clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from admit.agents.action_codec import action_space, to_deltas, to_env_action
from admit.agents.registry import make_controller
from admit.agents.sb3_policy import SB3Policy
from admit.agents.static_best import tuned_caps
from admit.controllers.around import AroundBase
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import load_scenario
from admit.envs.simulation import Simulation
from admit.evaluate.offline import run_policy
from admit.evaluate.results import policies_for
from admit.train.wrappers import AlgoAction

PRETRAINED = Path(__file__).resolve().parents[2] / "agents" / "pretrained"
SHIPPED = PRETRAINED / "ppo-seed-paper"
# one shipped PPO policy per results scenario that has one (docs/training.md); each must resolve as ppo:<scenario>
SHIPPED_SCENARIOS = ("seed-paper", "h200-mixed", "h200-azure-2023", "servegen-skewed")


# ---------------------------------------------------------------------------------- action codec
@pytest.mark.parametrize(("n", "k"), [(2, 1), (3, 2), (1, 4)])
def test_discrete_codec_is_a_bijection_onto_all_delta_vectors(n: int, k: int) -> None:
    space = action_space("discrete", n, k)
    decoded = {tuple(to_deltas(i, "discrete", n, k)) for i in range(space.n)}
    assert len(decoded) == (2 * k + 1) ** n
    assert all(-k <= d <= k for v in decoded for d in v)


def test_box_codec_rounds_to_the_nearest_delta_and_clips() -> None:
    assert to_deltas(np.array([-1.0, -0.49, 0.51, 1.0]), "box", 4, 1) == [-1, 0, 1, 1]
    assert to_deltas(np.array([-7.0, 0.24, 0.26, 9.0]), "box", 4, 2) == [-2, 0, 1, 2]
    assert to_deltas(np.array([0, 2]), "multidiscrete", 2, 1) == [-1, 1]


def test_wrapped_env_applies_the_decoded_deltas() -> None:
    env = AlgoAction(TenantAdmissionEnv("seed-paper"), "discrete")
    assert env.action_space == gym.spaces.Discrete(9)
    env.reset(seed=0)
    index = np.ravel_multi_index((0, 1), (3, 3))  # deltas (-1, 0)
    _, _, _, _, info = env.step(index)
    assert info["limits"] == [3, 4]  # seed-paper starts at 4
    box = AlgoAction(TenantAdmissionEnv("seed-paper"), "box")
    box.reset(seed=0)
    assert box.step(np.array([-0.9, -0.2], dtype=np.float32))[4]["limits"] == [3, 4]
    assert to_env_action(np.array([-0.9, -0.2]), "box", 2, 1).tolist() == [0, 1]


def test_flattening_too_many_tenants_is_refused() -> None:
    with pytest.raises(ValueError, match="use ppo, a2c or sac"):
        action_space("discrete", 8, 4)


# ---------------------------------------------------------------------------------- shipped policy
def test_shipped_policy_is_small_and_complete() -> None:
    for name in ("model.zip", "vecnormalize.pkl", "config.yaml"):
        assert (SHIPPED / name).is_file(), name
    assert sum(p.stat().st_size for p in SHIPPED.iterdir()) < 1_000_000


@pytest.mark.parametrize("policy", ["ppo:seed-paper", f"ppo:{SHIPPED}"])
def test_shipped_policy_loads_and_acts_deterministically(policy: str) -> None:
    sc = load_scenario("seed-paper")
    a, b = make_controller(policy), make_controller(policy)
    a.reset(sc.control_spec(), 0)
    b.reset(sc.control_spec(), 1)
    sim = Simulation(sc, 11)
    for _ in range(100):
        obs = sim.observe()
        deltas = a.act(obs)
        assert deltas == b.act(obs) == a.act(obs)
        assert len(deltas) == 2 and all(type(d) is int and -1 <= d <= 1 for d in deltas)
        sim.apply_deltas(deltas)
        sim.advance(sim.now + sc.interval_s)


def test_shipped_policy_learned_to_hold_the_limits_near_the_maximum() -> None:
    """In seed-paper (limits in [1, 4], start at 4, slots never interfere) nothing beats staying at 4.

    The shipped policy holds both tenants at 4 most of the time (mean limit about 3.84 over seeds 0–19),
    so it serves what static serves; naive, which throttles on latency, loses about a fifth of it.
    """
    sc = load_scenario("seed-paper")
    for seed in (0, 1):
        got, static, naive = (run_policy(sc, p, seed) for p in ("ppo:seed-paper", "static", "naive"))
        assert got["mean_limit"] > 3.7
        assert got["throughput_rps"] >= 0.99 * static["throughput_rps"] > naive["throughput_rps"]
        assert got["dropped"] <= static["dropped"] + 5 < naive["dropped"]


def test_every_shipped_folder_is_a_small_complete_policy_named_after_its_scenario() -> None:
    # static-best/ and static-contract/ hold static:best's and static:contract's tuned caps, one store per
    # scenario (tests/train/test_static_search.py checks them)
    folders = sorted(p.name for p in PRETRAINED.iterdir() if p.is_dir() and not p.name.startswith("static-"))
    assert {f"ppo-{s}" for s in SHIPPED_SCENARIOS} <= set(folders)
    for name in folders:
        folder = PRETRAINED / name
        algo, _, scenario = name.partition("-")
        trained = yaml.safe_load((folder / "config.yaml").read_text())
        # the tenant-set policies, trained across families, for every scenario (plain, and around the tuned caps)
        general = scenario in ("general", "general-untuned")
        for f in ("model.zip", "vecnormalize.pkl", "config.yaml", *(() if general else ("scenario.yaml",))):
            assert (folder / f).is_file(), f"{name}/{f}"
        # a 64x64 MLP with its Adam state (SB3's load wants it): ~0.2 MB for 2-3 tenants, ~0.45 MB for eight;
        # the tenant-set networks with theirs ~0.45-0.55 MB, and VecNormalize's return statistics for 64 envs
        assert sum(p.stat().st_size for p in folder.iterdir()) < 700_000, name
        if general:
            assert trained["algo"] == algo and trained["family"] and trained["policy"]["kind"] == "tenant-set"
            assert (trained["policy"]["anchor"] == "tuned") == (scenario == "general")
        else:
            assert (trained["algo"], trained["scenario"]) == (algo, scenario), name


@pytest.mark.parametrize("scenario", SHIPPED_SCENARIOS)
def test_each_shipped_policy_loads_and_acts_on_its_scenario(scenario: str) -> None:
    sc = load_scenario(scenario)
    spec, k = sc.control_spec(), sc.limits.max_step
    assert f"ppo:{scenario}" in policies_for(scenario)  # admit results puts it into the scenario's table
    ctrl = make_controller(f"ppo:{scenario}")
    ctrl.reset(spec, 0)
    sim = Simulation(sc, 3)
    for _ in range(40):
        obs = sim.observe()
        deltas = ctrl.act(obs)
        assert deltas == ctrl.act(obs)  # deterministic
        assert len(deltas) == len(sc.tenants) and all(type(d) is int and -k <= d <= k for d in deltas)
        sim.apply_deltas(deltas)
        sim.advance(sim.now + sc.interval_s)


# ---------------------------------------------------------------------------------- errors, imports
def test_registry_does_not_import_torch_until_an_sb3_policy_is_used() -> None:
    code = (
        "import sys\nfrom admit.agents.registry import make_controller\n"
        "make_controller('static')\nassert 'torch' not in sys.modules, 'torch imported'\n"
        "make_controller('ppo:seed-paper')\nassert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_unknown_run_lists_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"no such run folder or model; use ppo:RUN_DIR .* ppo:seed-paper"):
        make_controller("ppo:no-such-run")
    with pytest.raises(ValueError, match=r"needs an argument"):
        make_controller("ppo")


def test_wrong_algorithm_or_scenario_shape_is_refused() -> None:
    with pytest.raises(ValueError, match=r"trained with ppo; use --policy ppo:"):
        make_controller(f"a2c:{SHIPPED}")
    ctrl = make_controller("ppo:seed-paper")
    with pytest.raises(ValueError, match=r"trained on 2 tenants; this scenario has 3"):
        ctrl.reset(load_scenario("h200-mixed").control_spec(), 0)


@pytest.mark.parametrize("policy", ["ppo:general", "ppo:general-untuned"])
def test_shipped_general_policy_acts_on_every_tenant_count_and_max_step(policy: str) -> None:
    """ppo:general (around the tuned caps) and ppo:general-untuned are each one network for 2, 3 and 8 tenants
    and max_step 1, 4 and 16, deterministic."""
    for scenario in ("seed-paper", "h200-mixed", "servegen-skewed", "long-context-chat", "h200-mix@11000"):
        sc = load_scenario(scenario)
        spec, k = sc.control_spec(), sc.limits.max_step
        assert policy in policies_for(scenario)  # admit results puts it into every table
        ctrl = make_controller(policy)
        ctrl.reset(spec, 0)
        net = ctrl.inner if isinstance(ctrl, AroundBase) else ctrl  # ppo:general acts around static:best's caps
        assert isinstance(net, SB3Policy) and net.anchored == (policy == "ppo:general") == (net is not ctrl)
        if net.anchored:  # its anchors are the caps static:best deploys on the scenario
            assert net.anchors == ctrl.anchors == list(tuned_caps(sc).caps)
            if net.anchors == [spec.limits.initial] * spec.n_tenants:
                continue  # seed-paper: the caps are the initial limits, so holding moves nothing
        sim = Simulation(sc, 3)
        moved = 0
        for _ in range(30):
            obs = sim.observe()
            deltas = ctrl.act(obs)
            assert deltas == ctrl.act(obs)
            assert len(deltas) == len(sc.tenants) and all(type(d) is int and -k <= d <= k for d in deltas)
            moved += sum(d != 0 for d in deltas)
            sim.apply_deltas(deltas)
        assert moved > 0, scenario  # it uses the lever

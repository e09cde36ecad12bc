"""`admit train`: tiny real runs of PPO, DQN (Discrete wrapper) and SAC (Box wrapper) write every artefact;
bad configs fail naming the key; the same seed gives the same parameters; training seeds avoid evaluation's."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from admit.agents.registry import make_controller
from admit.envs.scenario import load_scenario
from admit.envs.simulation import Simulation
from admit.train.config import TrainConfigError, load_config
from admit.train.trainer import build_model, make_vec_env, train
from admit.train.wrappers import TRAIN_SEED_BASE
from stable_baselines3 import PPO
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_helpers import short_scenario, tiny_config
from typer.testing import CliRunner

from admit.cli import app

TIMESTEPS = 384  # 3 PPO rollouts of 64 steps × 2 envs, so every algorithm stops exactly here


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny training per algorithm through the real command line: 384 steps on 2 envs."""
    folder = tmp_path_factory.mktemp("train")
    scenario = short_scenario(folder)
    out = {}
    for algo in ("ppo", "dqn", "sac"):
        run = folder / f"run-{algo}"
        args = ["train", "--algo", algo, "--scenario", str(scenario), "--timesteps", str(TIMESTEPS)]
        args += ["--n-envs", "2", "--seed", "3", "--config", str(tiny_config(folder, algo)), "--out", str(run)]
        result = CliRunner().invoke(app, [*args, "--no-progress"])
        assert result.exit_code == 0, result.output
        assert f"--policy {algo}:{run}" in result.output
        out[algo] = run
    out["scenario"] = scenario
    return out


@pytest.mark.parametrize("algo", ["ppo", "dqn", "sac"])
def test_train_writes_every_artefact(runs: dict[str, Path], algo: str) -> None:
    run = runs[algo]
    for name in ("model.zip", "vecnormalize.pkl", "config.yaml", "scenario.yaml", "summary.json"):
        assert (run / name).is_file(), name
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "model_128_steps.zip",
        "model_256_steps.zip",
        "model_384_steps.zip",
        "model_vecnormalize_128_steps.pkl",
        "model_vecnormalize_256_steps.pkl",
        "model_vecnormalize_384_steps.pkl",
    ]
    assert (run / "best" / "best_model.zip").is_file() and (run / "best" / "vecnormalize.pkl").is_file()
    assert np.load(run / "eval" / "evaluations.npz")["results"].shape == (2, 1)  # 2 evaluations × 1 episode

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["algo"] == algo and cfg["timesteps"] == TIMESTEPS and cfg["seed"] == 3 and cfg["n_envs"] == 2
    assert "learning_rate" in cfg["hyperparams"]  # resolved: defaults written out
    assert load_config(run / "config.yaml").algo == algo  # the written config loads back
    assert json.loads((run / "summary.json").read_text())["timesteps"] == TIMESTEPS

    events = list((run / "tb").rglob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "episode/reward",
        "episode/throughput_rps",
        "episode/p99_s",
        "episode/goodput_rps",
        "episode/worst_attainment",
        "episode/dropped",
        "episode/mean_limit",
        *(f"episode/reward_terms/{t}" for t in ("throughput", "goodput", "slo_violation", "drop", "cost", "change")),
        "eval/mean_reward",
    ):
        assert tag in tags, (tag, sorted(tags))
    # the logged return is the raw (unnormalised) one: 50 steps of about 0.6 completions/s each
    assert 5 < acc.Scalars("episode/reward")[-1].value < 100


@pytest.mark.parametrize("algo", ["ppo", "dqn", "sac"])
def test_trained_policy_acts_with_valid_deltas(runs: dict[str, Path], algo: str) -> None:
    sc = load_scenario(runs["scenario"])
    ctrl = make_controller(f"{algo}:{runs[algo]}")
    ctrl.reset(sc.control_spec(), 0)
    sim = Simulation(sc, 7)
    seen = set()
    for _ in range(50):
        obs = sim.observe()
        deltas = ctrl.act(obs)
        assert isinstance(deltas, list) and len(deltas) == 2
        assert all(type(d) is int and -1 <= d <= 1 for d in deltas)
        assert ctrl.act(obs) == deltas  # deterministic
        seen.update(deltas)
        sim.apply_deltas(deltas)
        sim.advance(min(sim.now + sc.interval_s, sc.horizon_s))
    assert seen <= {-1, 0, 1}


def test_trained_policy_runs_in_admit_evaluate(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    args = ["evaluate", "--scenario", str(runs["scenario"]), "--policy", "static", "--policy", f"ppo:{runs['ppo']}"]
    result = CliRunner().invoke(app, [*args, "--seeds", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    ppo = data["policies"][f"ppo:{runs['ppo']}"]
    assert len(ppo["throughput_rps"]["values"]) == 3
    assert 1 <= ppo["mean_limit"]["mean"] <= 4


def test_policy_prefix_must_match_the_trained_algorithm(runs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"trained with dqn; use --policy dqn:"):
        make_controller(f"ppo:{runs['dqn']}")


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("hyperparams: {n_stepz: 5}", "hyperparams.n_stepz: unknown key for algo 'ppo'; allowed: learning_rate"),
        ("hyperparams: {gamma: 1.5}", "hyperparams.gamma: Input should be less than or equal to 1"),
        ("n_envs: 0", "n_envs: Input should be greater than or equal to 1"),
        ("vec_env: threads", "vec_env: Input should be 'dummy', 'subproc', 'block' or 'worlds'"),
        ("vec_workers: -1", "vec_workers: Input should be greater than or equal to 0"),
        ("evaluation: {freq: 5}", "evaluation: unknown key; allowed: algo, scenario"),
        ("eval: {every: 5}", "eval.every: unknown key; allowed: freq, episodes, seed_base"),
        ("algo: dqn\nhyperparams: {n_steps: 8}", "hyperparams.n_steps: unknown key for algo 'dqn'"),
        ("reward: {good: 1}", "reward.good: unknown key; allowed: throughput, goodput, slo_violation, drop"),
        ("reward: {goodput: lots}", "reward.goodput: Input should be a valid number"),
    ],
)
def test_bad_config_is_a_clear_error_naming_the_key(tmp_path: Path, yaml_text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(TrainConfigError) as err:
        load_config(path)
    assert needle in str(err.value)
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert needle in result.output
    assert not (tmp_path / "run").exists()  # nothing written, nothing trained


def test_bad_command_line_values_name_the_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--algo", "trpo", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "algo: Input should be 'ppo', 'a2c', 'dqn' or 'sac'" in result.output
    result = CliRunner().invoke(app, ["train", "--scenario", "nope", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "unknown scenario 'nope'" in result.output
    result = CliRunner().invoke(app, ["train", "--vec-env", "threads", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "vec_env: Input should be 'dummy', 'subproc', 'block' or 'worlds'" in result.output
    result = CliRunner().invoke(app, ["train", "--set", "hyperparams.n_stepz=5", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "hyperparams.n_stepz: unknown key for algo 'ppo'" in result.output
    result = CliRunner().invoke(app, ["train", "--set", "n_envs", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "expected KEY=VALUE" in result.output
    assert not (tmp_path / "r").exists()


def test_set_overrides_nested_keys_and_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("n_envs: 8\nhyperparams: {n_steps: 256, batch_size: 256, n_epochs: 7}\neval: {freq: 100}\n")
    sets = ["hyperparams.n_steps=32", "hyperparams.batch_size=1024", "policy.net_arch=[32, 32]", "vec_env=block"]
    cfg = load_config(path, sets=sets, n_envs=64)
    params = cfg.algo_params()
    assert (params["n_steps"], params["batch_size"], params["n_epochs"]) == (32, 1024, 7)
    assert cfg.policy.net_arch == [32, 32] and cfg.vec_env == "block" and cfg.vec_workers == 1
    assert cfg.n_envs == 64 and cfg.eval.freq == 100  # --n-envs wins over the file; untouched keys stay


def test_reward_override_replaces_only_the_weights_it_names(tmp_path: Path) -> None:
    """``reward:`` in a training config trains on those weights; the run folder's scenario.yaml says so,
    and the env's reward is then goodput (good requests/s) minus the drops it names, step by step."""
    from admit.envs.env import TenantAdmissionEnv
    from admit.train.trainer import training_scenario

    path = tmp_path / "c.yaml"
    path.write_text("scenario: h200-mixed\nreward: {throughput: 0, goodput: 1, slo_violation: 0}\n")
    sc = training_scenario(load_config(path))
    own = load_scenario("h200-mixed").reward
    assert (sc.reward.throughput, sc.reward.goodput, sc.reward.slo_violation) == (0, 1, 0)
    assert sc.reward.drop == own.drop and own.goodput == 0  # untouched keys keep the scenario's weights
    env = TenantAdmissionEnv(sc.model_copy(update={"horizon_s": 120.0}))
    env.reset(seed=3)
    good = 0.0
    for _ in range(60):
        _, reward, _, truncated, info = env.step(np.ones(env.n, dtype=np.int64))
        terms = info["reward_terms"]
        assert terms["throughput"] == 0 and terms["slo_violation"] == 0
        assert reward == pytest.approx(terms["goodput"] + terms["drop"])
        good += terms["goodput"] * sc.interval_s
        if truncated:
            break
    episode = info["episode_metrics"]
    assert good == pytest.approx(episode["goodput_rps"] * 120.0)  # the reward counts what goodput counts
    assert good > 0


def test_tenant_weights_weigh_each_tenants_requests_in_the_reward() -> None:
    """``reward.tenant_weights``: a tenant of weight 3 counts each of its good requests three times; the
    episode's reward is then Σ weight·good / Δ where the plain one is Σ good / Δ, on the same trajectory."""
    from admit.envs.env import TenantAdmissionEnv

    base = load_scenario("h200-mixed", horizon_s=60.0)
    weights = (3.0, 1.0, 0.5)
    tenants = [t.model_copy(update={"weight": w}) for t, w in zip(base.tenants, weights, strict=True)]
    plain = base.model_copy(update={"tenants": tenants, "reward": base.reward.model_copy(
        update={"goodput": 1.0, "throughput": 0.0, "slo_violation": 0.0, "drop": 0.0})})
    weighted = plain.model_copy(update={"reward": plain.reward.model_copy(update={"tenant_weights": True})})
    a, b = TenantAdmissionEnv(plain), TenantAdmissionEnv(weighted)
    a.reset(seed=4)
    b.reset(seed=4)
    hold = np.full(3, base.limits.max_step, dtype=np.int64)
    sums = [0.0, 0.0]
    done = False
    while not done:
        _, ra, _, done, ia = a.step(hold)
        _, rb, _, _, ib = b.step(hold)
        assert ia["completions"] == ib["completions"] and isinstance(ib["completions"], int)  # plain counts
        sums[0] += ra * plain.interval_s
        sums[1] += rb * plain.interval_s
    good = [t["good"] for t in a.sim.tenant_summary().values()]
    assert sum(good) > 0
    assert sums[0] == pytest.approx(sum(good))
    assert sums[1] == pytest.approx(sum(w * g for w, g in zip(weights, good, strict=True)))


def _params(run: Path) -> dict[str, torch.Tensor]:
    return PPO.load(run / "model.zip", device="cpu").policy.state_dict()


def test_same_seed_same_parameters(tmp_path: Path) -> None:
    scenario = str(short_scenario(tmp_path))
    common = {"scenario": scenario, "timesteps": 256, "n_envs": 2, "eval": {"freq": 0}, "checkpoint_freq": 0}
    hp = {"hyperparams": {"n_steps": 64, "batch_size": 64, "n_epochs": 2}, "policy": {"net_arch": [16, 16]}}
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        train(load_config(None, seed=seed, **common, **hp), tmp_path / name, progress=False)
    a, b, c = _params(tmp_path / "a"), _params(tmp_path / "b"), _params(tmp_path / "c")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    # and the normalisation statistics too
    norms = [pickle.loads((tmp_path / n / "vecnormalize.pkl").read_bytes()) for n in ("a", "b")]
    assert np.array_equal(norms[0].obs_rms.mean, norms[1].obs_rms.mean)
    assert np.array_equal(norms[0].obs_rms.var, norms[1].obs_rms.var)


def test_block_and_worlds_vec_envs_train_the_same_parameters_as_dummy(tmp_path: Path) -> None:
    """Where an env is stepped (trainer or worker process, or every world in one kernel call) changes nothing:
    same seed, same parameters, across the autoresets (50 decisions an episode, 128 steps per env)."""
    scenario = str(short_scenario(tmp_path))
    common = {"scenario": scenario, "timesteps": 384, "n_envs": 3, "seed": 4, "eval": {"freq": 0}, "checkpoint_freq": 0}
    hp = {"hyperparams": {"n_steps": 64, "batch_size": 64, "n_epochs": 2}, "policy": {"net_arch": [16, 16]}}
    runs = {"dummy": {"vec_env": "dummy"}, "block": {"vec_env": "block", "vec_workers": 1},
            "worlds": {"vec_env": "worlds"}}
    for name, vec in runs.items():
        summary = train(load_config(None, **common, **hp, **vec), tmp_path / name, progress=False)
        assert summary["vec_env"] == vec["vec_env"] and summary["timesteps"] == 384
    a = _params(tmp_path / "dummy")
    norms = {n: pickle.loads((tmp_path / n / "vecnormalize.pkl").read_bytes()) for n in runs}
    for other in ("block", "worlds"):
        b = _params(tmp_path / other)
        assert all(torch.equal(a[k], b[k]) for k in a), other
        assert np.array_equal(norms["dummy"].obs_rms.var, norms[other].obs_rms.var), other
        assert np.array_equal(norms["dummy"].ret_rms.var, norms[other].ret_rms.var), other


def test_worlds_vec_env_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    cfg = load_config(None, scenario="seed-paper", algo="dqn", vec_env="worlds", n_envs=2)
    with pytest.raises(ValueError, match="vec_env: worlds runs the env's own MultiDiscrete action.*'discrete'"):
        make_vec_env(cfg, load_scenario("seed-paper"))


def test_training_episodes_never_use_evaluation_seeds(tmp_path: Path) -> None:
    sc = load_scenario(short_scenario(tmp_path))
    cfg = load_config(None, scenario="seed-paper", n_envs=3, seed=2, eval={"freq": 0}, checkpoint_freq=0)
    venv = make_vec_env(cfg, sc)
    try:
        build_model(cfg, venv, None)  # seeding the algorithm calls venv.seed(2): it must not reach the workload
        venv.reset()
        first = [venv.unwrapped.reset_infos[i]["episode_seed"] for i in range(3)]
        assert first == [TRAIN_SEED_BASE + 2000 + i for i in range(3)]
        for _ in range(50):  # one episode (50 decisions): every env auto-resets once
            venv.step(np.ones((3, 2), dtype=np.int64))
        second = [venv.unwrapped.reset_infos[i]["episode_seed"] for i in range(3)]
    finally:
        venv.close()
    assert second == [TRAIN_SEED_BASE + 2000 + 3 + i for i in range(3)]  # stride n_envs: never collide


def test_update_threads_apply_to_the_update_only_and_runs_stay_reproducible(tmp_path: Path) -> None:
    """With ``update_threads: 2`` the update runs on two torch threads and the rollout on ``torch_threads``;
    the same seed still gives the same parameters."""
    from admit.train import trainer

    seen: dict[str, set[int]] = {"update": set(), "rollout": set()}

    class Recording(PPO):
        def train(self) -> None:
            seen["update"].add(torch.get_num_threads())
            super().train()

        def _update_info_buffer(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            seen["rollout"].add(torch.get_num_threads())  # SB3 calls it at every rollout step
            return super()._update_info_buffer(*args, **kwargs)

    scenario = str(short_scenario(tmp_path))
    common = {"scenario": scenario, "timesteps": 256, "n_envs": 2, "seed": 5, "eval": {"freq": 0},
              "checkpoint_freq": 0, "update_threads": 2}
    hp = {"hyperparams": {"n_steps": 64, "batch_size": 64, "n_epochs": 2}, "policy": {"net_arch": [16, 16]}}
    before = torch.get_num_threads()
    original = trainer.ALGORITHMS["ppo"]
    trainer.ALGORITHMS["ppo"] = Recording
    try:
        for name in ("a", "b"):
            train(load_config(None, **common, **hp), tmp_path / name, progress=False)
    finally:
        trainer.ALGORITHMS["ppo"] = original
        torch.set_num_threads(before)
    assert seen == {"update": {2}, "rollout": {1}}
    a, b = _params(tmp_path / "a"), _params(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_validation_episodes_run_side_by_side_and_score_what_one_env_scores(tmp_path: Path) -> None:
    """make_eval_env steps the validation episodes in parallel envs: the same seeds, the same returns as
    running them one after another in a single env."""
    from admit.train.trainer import env_factory, make_eval_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize

    sc = load_scenario(short_scenario(tmp_path))
    cfg = load_config(None, scenario="seed-paper", n_envs=2, seed=1, eval={"freq": 64, "episodes": 3},
                      checkpoint_freq=0, hyperparams={"n_steps": 32, "batch_size": 32, "n_epochs": 1})
    venv = make_vec_env(cfg, sc)
    try:
        model = build_model(cfg, venv, None)
        batched = make_eval_env(cfg, sc)
        assert batched.num_envs == 3
        base = cfg.eval.seed_base
        assert batched.get_attr("base") == [base, base + 1, base + 2] and batched.get_attr("stride") == [3, 3, 3]
        got, _ = evaluate_policy(model, batched, n_eval_episodes=3, deterministic=True, return_episode_rewards=True)
        one = VecNormalize(VecMonitor(DummyVecEnv([env_factory(sc, "multidiscrete", base, 1)])),
                           training=False, norm_reward=False)
        want, _ = evaluate_policy(model, one, n_eval_episodes=3, deterministic=True, return_episode_rewards=True)
    finally:
        venv.close()
    assert sorted(got) == sorted(want) and len(set(want)) == 3  # three different episodes, the same three


def test_several_seeds_in_one_command_report_their_spread_and_each_run_is_that_seeds_own(tmp_path: Path) -> None:
    """``admit train --seeds 5,6``: a run per seed, each the same parameters as ``--seed S`` alone, and
    seeds.json with each seed's validation returns (those of its summary.json), their spread and the best seed;
    --seed beside --seeds, or seeds that do not parse, are clear errors."""
    scenario = short_scenario(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "timesteps": 128, "n_envs": 2, "checkpoint_freq": 0, "eval": {"freq": 64, "episodes": 2},
        "hyperparams": {"n_steps": 32, "batch_size": 32, "n_epochs": 1}, "policy": {"net_arch": [16, 16]}}))
    args = ["train", "--scenario", str(scenario), "--config", str(config), "--no-progress"]
    result = CliRunner().invoke(app, [*args, "--seeds", "5,6", "--out", str(tmp_path / "many")])
    assert result.exit_code == 0, result.output
    assert "2 runs in" in result.output and "best validation return over the seeds" in result.output
    report = json.loads((tmp_path / "many" / "seeds.json").read_text())
    assert report["seeds"] == [5, 6] and set(report["runs"]) == {"5", "6"}
    values = []
    for s in ("5", "6"):
        summary = json.loads((tmp_path / "many" / f"seed-{s}" / "summary.json").read_text())
        assert report["runs"][s]["validation_return_best"] == summary["validation_return_best"]
        values.append(summary["validation_return_best"])
    spread = report["validation_return_best"]
    assert spread["values"] == values and spread["min"] == min(values) and spread["max"] == max(values)
    assert spread["mean"] == pytest.approx(sum(values) / 2) and spread["ci95"][0] <= spread["mean"] <= spread["ci95"][1]
    assert report["best_seed"] == (5 if values[0] >= values[1] else 6) and "above_hold" not in report  # not paired
    one = CliRunner().invoke(app, [*args, "--seed", "6", "--out", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    a, b = _params(tmp_path / "many" / "seed-6"), _params(tmp_path / "one")
    assert all(torch.equal(a[k], b[k]) for k in a)
    both = CliRunner().invoke(app, [*args, "--seed", "1", "--seeds", "2,3", "--out", str(tmp_path / "x")])
    assert both.exit_code == 2 and "not both" in both.output
    bad = CliRunner().invoke(app, [*args, "--seeds", "two", "--out", str(tmp_path / "y")])
    assert bad.exit_code == 2 and "give A..B (inclusive), A, or A,B,C" in bad.output
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()

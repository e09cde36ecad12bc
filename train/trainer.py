"""Train an SB3 policy on TenantAdmission-v1 and write everything ``admit evaluate`` needs to run it.

``train(cfg, out)`` writes into ``out``::

    model.zip              the final SB3 model (loaded by ``--policy ALGO:out``)
    vecnormalize.pkl       VecNormalize statistics (observation mean/var; the policy reuses them frozen)
    config.yaml            the resolved TrainConfig, defaults included
    scenario.yaml          the scenario as trained on (provenance: a bundled scenario may change later)
    summary.json           wall time, env steps/s, last validation score
    tb/                    TensorBoard event files (SB3's own scalars and admit.train.callbacks' episode/*)
    checkpoints/           model_<steps>_steps.zip + model_vecnormalize_<steps>_steps.pkl every checkpoint_freq
    best/                  best_model.zip + vecnormalize.pkl, the best validation score (EvalCallback)
    eval/evaluations.npz   validation returns per evaluation

``train_seeds(cfg, seeds, out)`` (``admit train --seeds A..B``) runs the same recipe once per seed, into
``out/seed-S/`` each, and writes ``out/seeds.json``: every run's validation returns and how they spread over
the seeds (mean, standard deviation, the 95% interval, the best seed), so a recipe's sensitivity to its seed
is measured with it. The runs share what a recipe tunes first (the instances' caps: searched by the first,
found in the cache by the others).

Seeds: the algorithm (torch, numpy, action-space sampling) is seeded with ``cfg.seed``; the workload of
episode j in training env i is drawn from ``1_000_000 + 1000·seed + i + n_envs·j`` and the validation
episodes from ``eval.seed_base + j``, j < eval.episodes (admit.train.wrappers; ``make_eval_env``), all
disjoint from the evaluation seeds 0..19.
With ``n_envs`` and the machine fixed, the same config gives the same final parameters — with any
``vec_env``: ``dummy`` (all envs in the trainer), ``subproc`` (one process per env) or ``block``
(admit.train.vec.BlockVecEnv: the envs in blocks, one in the trainer and one per ``vec_workers`` process)
only change where the envs are stepped.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
import yaml
from admit.agents.action_codec import ActionKind
from admit.envs.scenario import Scenario, load_scenario
from admit.train.callbacks import (
    EpisodeMetricsLogger,
    RichProgress,
    SaveVecNormalize,
    SeededEvalCallback,
    UpdateThreads,
)
from admit.train.config import TrainConfig, write_config
from admit.train.imitation import imitate
from admit.train.vec import BlockVecEnv, WorldsVecEnv
from admit.train.worlds import Paired, SetEnv, Split, Worlds, search_pool, with_reward
from admit.train.wrappers import MakeEnv, MakeSetEnv, train_episode_seed_base
from stable_baselines3 import A2C, DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecMonitor, VecNormalize

ALGORITHMS: dict[str, type[BaseAlgorithm]] = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "sac": SAC}
ACTION_KIND: dict[str, ActionKind] = {"ppo": "multidiscrete", "a2c": "multidiscrete", "dqn": "discrete", "sac": "box"}
ACTIVATIONS: dict[str, type[torch.nn.Module]] = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}

MODEL_FILE = "model.zip"
VECNORMALIZE_FILE = "vecnormalize.pkl"
CONFIG_FILE = "config.yaml"


def env_factory(scenario: Scenario, kind: ActionKind, seed_base: int, seed_stride: int) -> Callable[[], gym.Env]:
    """A picklable constructor of one wrapped env (worker processes rebuild it)."""
    return MakeEnv(scenario, kind, seed_base, seed_stride)


def worlds_of(cfg: TrainConfig, scenario: Scenario | None, split: Split) -> Worlds:
    """Where a tenant-set run's episodes come from: the family's ``split`` seeds, or the one scenario."""
    weights = cfg.reward.weights() if cfg.reward is not None else None
    anchored = cfg.policy.anchor == "tuned"
    if cfg.family is not None:
        pool = None if cfg.family_pool is None else getattr(cfg.family_pool, split)
        family = cfg.family if isinstance(cfg.family, str) else tuple(cfg.family)
        k = 5 if cfg.family_pool is None or not anchored else cfg.family_pool.search_seeds
        return Worlds(family=family, split=split, reward=weights, anchored=anchored, pool=pool, search_seeds=k)
    assert scenario is not None
    return Worlds(scenario=scenario, anchored=anchored)  # training_scenario already holds the reward override


def _factory(
    cfg: TrainConfig, scenario: Scenario | None, split: Split, base: int, stride: int
) -> Callable[[], gym.Env]:
    if cfg.policy.kind == "tenant-set":
        paired = None if cfg.paired_reward is None else Paired(cfg.paired_reward.tenant_penalty,
                                                                cfg.paired_reward.tolerance)
        return MakeSetEnv(worlds_of(cfg, scenario, split), cfg.reward_per_offered_load, base, stride,
                          cfg.policy.anchor_factors, paired, cfg.policy.contract_features)
    assert scenario is not None
    return env_factory(scenario, ACTION_KIND[cfg.algo], base, stride)


def make_vec_env(cfg: TrainConfig, scenario: Scenario | None) -> VecNormalize:
    """The training envs: n_envs seeded envs → VecMonitor → VecNormalize (obs and, if set, reward)."""
    fns = [
        _factory(cfg, scenario, "train", train_episode_seed_base(cfg.seed, i), cfg.n_envs) for i in range(cfg.n_envs)
    ] if cfg.vec_env != "worlds" else []
    venv: VecEnv
    if cfg.vec_env == "worlds":
        venv = _worlds_vec_env(cfg, scenario)
    elif cfg.vec_env == "block":
        venv = BlockVecEnv(fns, workers=min(cfg.vec_workers, cfg.n_envs - 1))
    elif cfg.vec_env == "subproc" and cfg.n_envs > 1:
        venv = SubprocVecEnv(fns)
    else:
        venv = DummyVecEnv(fns)
    n = cfg.normalize
    return VecNormalize(
        VecMonitor(venv), norm_obs=_norm_obs(cfg), norm_reward=n.reward, clip_obs=n.clip_obs, gamma=_gamma(cfg)
    )


def _worlds_vec_env(cfg: TrainConfig, scenario: Scenario | None) -> VecEnv:
    """``vec_env: worlds``: the n_envs worlds in one native vector env (admit.envs.vector), with the episode seeds
    the other runners' EpisodeSeeds give, so a run trains as it does on ``dummy``."""
    from admit.envs.vector import TenantAdmissionVectorEnv

    kind = ACTION_KIND[cfg.algo]
    if cfg.policy.kind != "mlp" or scenario is None or kind != "multidiscrete":
        raise ValueError(f"vec_env: worlds runs the env's own MultiDiscrete action on one scenario (policy.kind mlp, "
                         f"an algo whose action is multidiscrete); this config has policy.kind "
                         f"{cfg.policy.kind!r}, action {kind!r}{'' if scenario else ', a family'}: use dummy or block")
    bases = [train_episode_seed_base(cfg.seed, i) for i in range(cfg.n_envs)]
    return WorldsVecEnv(TenantAdmissionVectorEnv(cfg.n_envs, scenario), bases, cfg.n_envs)


def _norm_obs(cfg: TrainConfig) -> bool:
    """The tenant-set policy takes raw features (log1p inside the network; a running mean would also move the
    padding slots off zero), so observation normalisation applies to the MLP policy only."""
    return cfg.normalize.obs and cfg.policy.kind == "mlp"


EVAL_ENVS_MAX = 16


def make_eval_env(cfg: TrainConfig, scenario: Scenario | None) -> VecNormalize:
    """The validation episodes, seeds eval.seed_base + j for j < eval.episodes (a family's validation
    instances), stepped side by side: ``k = min(episodes, 16)`` envs, env i running seeds seed_base + i + k·m,
    so one evaluation is one batched pass instead of ``episodes`` one-env passes (the same episodes, the same
    deterministic returns). Frozen normalisation, raw rewards."""
    k = max(1, min(cfg.eval.episodes, EVAL_ENVS_MAX))
    fns = [_factory(cfg, scenario, "validation", cfg.eval.seed_base + i, k) for i in range(k)]
    n = cfg.normalize
    return VecNormalize(
        VecMonitor(DummyVecEnv(fns)), training=False, norm_obs=_norm_obs(cfg), norm_reward=False, clip_obs=n.clip_obs
    )


def _gamma(cfg: TrainConfig) -> float:
    return float(cfg.algo_params()["gamma"])


def build_model(cfg: TrainConfig, venv: VecEnv, tensorboard_dir: Path | None) -> BaseAlgorithm:
    policy: Any = "MlpPolicy"
    policy_kwargs: dict[str, Any] = {
        "net_arch": list(cfg.policy.net_arch),
        "activation_fn": ACTIVATIONS[cfg.policy.activation],
    }
    if cfg.policy.kind == "tenant-set":
        from admit.agents.set_policy import TenantSetPolicy

        policy, policy_kwargs = TenantSetPolicy, {"hidden": cfg.policy.hidden, "activation": cfg.policy.activation,
                                                  "hold_bias": cfg.policy.hold_bias,
                                                  "factors": cfg.policy.anchor_factors}
    return ALGORITHMS[cfg.algo](
        policy,
        venv,
        seed=cfg.seed,
        device="cpu",
        verbose=0,
        tensorboard_log=str(tensorboard_dir) if tensorboard_dir is not None else None,
        policy_kwargs=policy_kwargs,
        **cfg.algo_params(),
    )


def training_scenario(cfg: TrainConfig) -> Scenario:
    """The scenario trained on: ``cfg.scenario`` with the config's reward weights, if any, in place of its own."""
    return with_reward(load_scenario(cfg.scenario), cfg.reward.weights() if cfg.reward is not None else None)


def search_anchors(cfg: TrainConfig, scenario: Scenario | None) -> float:
    """Search (or find in the cache) the caps of every instance an anchored or imitating run draws, before its
    envs start, so the env worker processes read them from the cache; returns the seconds it took (0 when
    the run needs no caps)."""
    if cfg.policy.anchor != "tuned" and cfg.imitation is None:
        return 0.0
    t0 = time.perf_counter()
    both = cfg.eval.freq > 0 and cfg.policy.anchor == "tuned"  # imitation: the train instances only
    if cfg.imitation is not None and not both:
        k = cfg.imitation.search_seeds
    else:  # anchored: static:best's own seeds, or the first family_pool.search_seeds of them
        k = cfg.family_pool.search_seeds if cfg.family_pool is not None else 5
    for split in ("train", "validation") if both else ("train",):
        search_pool(worlds_of(cfg, scenario, split), workers=max(1, min(2, os.cpu_count() or 1)), search_seeds=k)
    return time.perf_counter() - t0


SEEDS_FILE = "seeds.json"


def train_seeds(cfg: TrainConfig, seeds: list[int], out: str | Path, progress: bool = True,
                on_run: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """``train`` once per seed of ``seeds`` (``cfg.seed`` replaced), into ``out/seed-S/``; ``on_run(seed,
    summary)`` after each. Returns the report also written to ``out/seeds.json`` (module docstring)."""
    from admit.core.stats import summarize
    from admit.envs.compiled import release_freed_memory

    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds: give each seed >= 0 once, got {seeds}")
    out = Path(out)
    runs: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for s in seeds:
        summary = train(cfg.model_copy(update={"seed": int(s)}), out / f"seed-{s}", progress)
        gc.collect()
        release_freed_memory()  # the run's worlds are gone: the next run starts from a trimmed heap
        runs[str(s)] = {"folder": f"seed-{s}", **{k: summary.get(k) for k in (
            "validation_return_best", "validation_return_last", "wall_s", "caps_tuning_s", "env_steps_per_s")}}
        if on_run is not None:
            on_run(s, summary)
    report: dict[str, Any] = {"seeds": list(seeds), "wall_s": time.perf_counter() - t0, "runs": runs}
    for key in ("validation_return_best", "validation_return_last"):
        values = [r[key] for r in runs.values()]
        if all(v is not None for v in values):
            report[key] = {**summarize(values), "min": min(values), "max": max(values), "values": values}
    if "validation_return_best" in report:
        best = max(runs, key=lambda k: runs[k]["validation_return_best"])
        report["best_seed"] = int(best)  # the rule every shipped model is chosen by: the best validation return
        if cfg.paired_reward is not None:  # the paired return of holding the anchors is exactly 0
            report["above_hold"] = sum(1 for r in runs.values() if r["validation_return_best"] > 0)
    (out / SEEDS_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def train(cfg: TrainConfig, out: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run one training; returns the summary that is also written to ``out/summary.json``."""
    torch.set_num_threads(cfg.torch_threads)
    # SB3 builds a torch distribution at every step from our own network's outputs; skip re-validating them.
    torch.distributions.Distribution.set_default_validate_args(False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    scenario = training_scenario(cfg) if cfg.family is None else None
    write_config(cfg, out / CONFIG_FILE)
    if scenario is not None:
        (out / "scenario.yaml").write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))

    search_s = search_anchors(cfg, scenario)
    venv = make_vec_env(cfg, scenario)
    model = build_model(cfg, venv, out / "tb")
    imitation: list[dict[str, float]] = []
    imitation_s = 0.0
    if cfg.imitation is not None:
        t0 = time.perf_counter()
        im = cfg.imitation
        imitation = imitate(model.policy, SetEnv(worlds_of(cfg, scenario, "train"), cfg.reward_per_offered_load),
                            rounds=im.rounds, episodes=im.episodes, noise=im.noise, dagger_episodes=im.dagger_episodes,
                            dagger_noise=im.dagger_noise, epochs=im.epochs, lr=im.learning_rate,
                            batch=im.batch_size, seed=cfg.seed, log=print if progress else None,
                            search_seeds=im.search_seeds)
        imitation_s = time.perf_counter() - t0
    callbacks: list[BaseCallback] = [EpisodeMetricsLogger()]
    if cfg.update_threads is not None and cfg.update_threads != cfg.torch_threads:
        callbacks.append(UpdateThreads(cfg.torch_threads, cfg.update_threads))
    steps_per_call = cfg.n_envs
    if cfg.checkpoint_freq > 0:
        callbacks.append(
            CheckpointCallback(
                save_freq=max(cfg.checkpoint_freq // steps_per_call, 1),
                save_path=str(out / "checkpoints"),
                name_prefix="model",
                save_vecnormalize=True,
            )
        )
    eval_env = None
    if cfg.eval.freq > 0:
        eval_env = make_eval_env(cfg, scenario)
        callbacks.append(
            SeededEvalCallback(
                eval_env,
                n_eval_episodes=cfg.eval.episodes,
                eval_freq=max(cfg.eval.freq // steps_per_call, 1),
                best_model_save_path=str(out / "best"),
                log_path=str(out / "eval"),
                deterministic=True,
                callback_on_new_best=SaveVecNormalize(out / "best" / VECNORMALIZE_FILE),
                verbose=0,
            )
        )
    if progress:
        callbacks.append(RichProgress())

    start = time.perf_counter()
    try:
        if cfg.timesteps > 0:
            model.learn(total_timesteps=cfg.timesteps, callback=callbacks, tb_log_name="run",
                        reset_num_timesteps=True)
    finally:
        wall = time.perf_counter() - start
        venv.close()
        if eval_env is not None:
            eval_env.close()
    model.save(str(out / MODEL_FILE))
    venv.save(str(out / VECNORMALIZE_FILE))
    summary: dict[str, Any] = {
        "algo": cfg.algo,
        "scenario": scenario.name if scenario is not None else worlds_of(cfg, None, "train").describe(),
        "timesteps": int(model.num_timesteps),
        "wall_s": wall,
        "caps_tuning_s": search_s,  # summary.json's name for the caps search's seconds, as the shipped runs have it
        "imitation_s": imitation_s,
        "imitation": imitation,
        "env_steps_per_s": model.num_timesteps / wall if wall > 0 and model.num_timesteps else None,
        "n_envs": cfg.n_envs,
        "vec_env": cfg.vec_env,
    }
    eval_cb = next((c for c in callbacks if isinstance(c, SeededEvalCallback)), None)
    if eval_cb is not None and eval_cb.evaluations_results:
        summary["validation_return_last"] = float(sum(eval_cb.evaluations_results[-1]) / cfg.eval.episodes)
        summary["validation_return_best"] = float(eval_cb.best_mean_reward)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary

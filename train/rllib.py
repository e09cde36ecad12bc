"""The env for Ray RLlib: registered by name (``register_env``), since Gymnasium's registry lives in the
process that imported admit and a remote env runner never sees it.

RLlib builds each env runner's envs from a name and an ``env_config`` dict, in its own worker processes, so
the name must be registered with Ray (``ray.tune.registry.register_env``), which ships the creator to every
worker. `register` does that for :data:`ENV_NAME`; `make_env` is the creator. The keys of ``env_config``:

* ``scenario``: what `load_scenario` takes: a bundled name, a YAML path readable on every node, or a family
  instance ``FAMILY@SEED`` (default ``seed-paper``);
* ``layout``: the observation layout (core/observation.py; default the current one);
* ``horizon_s``: simulated seconds per episode instead of the scenario's (a shorter episode).

Anything else is refused with the allowed keys, so a misspelt key does not quietly train on the default.
Every env runner gets the same scenario: the observation and action spaces follow its tenant count, and
RLlib wants one pair of spaces for the whole run. (Training across tenant mixes is ppo:general's,
`admit train --family`, on SB3: docs/training.md.)

`ppo_config` is a small PPO configuration on the new API stack for that env (the smoke run in
tests/train/test_rllib.py, and a starting point on a cluster); Ray is the optional extra ``admit[ray]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from admit.envs.env import TenantAdmissionEnv

ENV_NAME = "admit-TenantAdmission-v1"
ENV_CONFIG_KEYS = ("scenario", "layout", "horizon_s")
INSTALL = "pip install 'admit[ray]'"


def make_env(env_config: Mapping[str, Any] | None = None) -> TenantAdmissionEnv:
    """The env an RLlib env runner builds from ``env_config`` (module doc); ValueError on an unknown key."""
    from admit.envs.scenario import load_scenario

    cfg = dict(env_config or {})  # an RLlib EnvContext is a dict with the runner's index as attributes
    unknown = sorted(set(cfg) - set(ENV_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"env_config has unknown key(s) {', '.join(map(repr, unknown))}; allowed: "
                         f"{', '.join(ENV_CONFIG_KEYS)}")
    name = cfg.get("scenario", "seed-paper")
    scenario = load_scenario(name) if cfg.get("horizon_s") is None else load_scenario(
        name, horizon_s=float(cfg["horizon_s"]))
    kwargs: dict[str, Any] = {} if cfg.get("layout") is None else {"layout": int(cfg["layout"])}
    return TenantAdmissionEnv(scenario, **kwargs)


def register(name: str = ENV_NAME) -> str:
    """Register `make_env` with Ray under ``name`` (visible to every worker of the cluster); returns the name.

    Ray Tune keys its registry by the job id it first saw in this process and keeps it after ``ray.shutdown``:
    in a process that ran an earlier Ray session (``admit tune``, then RLlib; a notebook) the creator would be
    filed under that old job's key, where this job's env runners do not look ("Environment ... doesn't
    exist"). The key is dropped first so that it is the current job's."""
    try:
        from ray.tune import registry
    except ImportError:
        raise RuntimeError(f"RLlib needs Ray with its rllib extra, which is not installed: {INSTALL}") from None
    registry._global_registry._prefix = None  # the current job's id is read again (docstring)
    registry.register_env(name, make_env)
    return name


def ppo_config(env_config: Mapping[str, Any] | None = None, env_runners: int = 1, batch: int = 512,
               seed: int = 0) -> Any:
    """A small RLlib PPO configuration on the registered env: ``env_runners`` remote env runners (0: sample in
    the driver), ``batch`` env steps per training iteration, a 64×64 network, one learner in the driver."""
    from ray.rllib.algorithms.ppo import PPOConfig

    make_env(env_config).close()  # a bad env_config fails here, in the driver, not in a remote runner
    return (
        PPOConfig()
        .environment(register(), env_config=dict(env_config or {}))
        .framework("torch")
        .env_runners(num_env_runners=env_runners, num_envs_per_env_runner=1,
                     rollout_fragment_length=max(1, batch // max(1, env_runners)))
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=batch, minibatch_size=min(128, batch), num_epochs=2, lr=3e-4)
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .debugging(seed=seed)
    )

"""RLlib on the env: registered with Ray by name (train/rllib.py), built by a remote env runner, and a short
PPO run on a real local Ray instance that samples, learns and acts within the action space."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'admit[ray]'; `make test` installs it)")
pytest.importorskip("ray.rllib", reason="RLlib is not installed (pip install 'admit[ray]'; `make test` installs it)")

from admit.envs.scenario import load_scenario  # noqa: E402
from admit.envs.simulation import decision_count  # noqa: E402
from admit.train.rllib import ENV_NAME, make_env, ppo_config  # noqa: E402

# bounds a hang; Ray starts in tens of seconds on a loaded machine
pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # workers at normal priority (Ray nices them to 15 by default, which starves them on a busy machine)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             _system_config={"worker_niceness": 0})
    try:
        yield
    finally:
        ray.shutdown()


def _weights(algo: Any) -> np.ndarray:
    state = algo.get_module().get_state()
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in state.values()])


def test_ppo_on_the_registered_env_samples_in_a_remote_runner_learns_and_acts(local_ray: None) -> None:
    import torch

    torch.set_num_threads(1)
    cfg = {"scenario": "seed-paper", "horizon_s": 120}
    algo = ppo_config(cfg, env_runners=1, batch=256).build_algo()
    try:
        assert algo.config.env == ENV_NAME and algo.config.num_env_runners == 1  # sampled in another process
        before = _weights(algo)
        results = [algo.train() for _ in range(3)]
        last = results[-1]
        assert last["num_env_steps_sampled_lifetime"] == 3 * 256
        # one runner steps one env in sequence: every whole episode of the 768 steps ended there
        steps = decision_count(load_scenario("seed-paper", horizon_s=120))
        assert last["env_runners"]["num_episodes_lifetime"] == 3 * 256 // steps
        assert math.isfinite(last["env_runners"]["episode_return_mean"])
        assert math.isfinite(last["learners"]["default_policy"]["total_loss"])
        assert not np.array_equal(_weights(algo), before)  # the learner updated the network
        env = make_env(cfg)
        obs, _ = env.reset(seed=1)
        module = algo.get_module()
        out = module.forward_inference({"obs": torch.as_tensor(obs[None], dtype=torch.float32)})
        dist = module.get_inference_action_dist_cls().from_logits(out["action_dist_inputs"])
        action = dist.to_deterministic().sample().numpy()[0]
        assert env.action_space.contains(action.astype(env.action_space.dtype))
        env.step(action)
    finally:
        algo.stop()


def test_the_env_is_registered_for_this_job_after_an_earlier_ray_session(local_ray: None) -> None:
    """An earlier Ray session in this process (admit tune on a cluster, here a stale job id) leaves Ray Tune's
    registry keyed by its job; registering again must reach this job's workers, which look it up there."""
    from admit.train.rllib import register
    from ray.tune import registry

    registry._global_registry._prefix = "ff000000"  # what a session that was the cluster's 255th job leaves

    @ray.remote(num_cpus=0)
    def seen(name: str) -> bool:  # a worker looks the creator up under its own (this) job's id
        return bool(registry._global_registry.contains(registry.ENV_CREATOR, name))

    assert register() == ENV_NAME
    assert ray.get(seen.remote(ENV_NAME))
    assert not ray.get(seen.remote("admit-never-registered"))


def test_a_bad_env_config_is_refused_in_the_driver_with_the_allowed_keys() -> None:
    with pytest.raises(ValueError, match="unknown key.*'scenarios'.*allowed: scenario, layout, horizon_s"):
        ppo_config({"scenarios": "seed-paper"})
    with pytest.raises(ValueError, match="no-such"):
        make_env({"scenario": "no-such"})

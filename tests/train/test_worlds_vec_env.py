"""``WorldsVecEnv``: the native vector env as an SB3 VecEnv gives what SB3's DummyVecEnv over single envs gives
(same-step autoreset, terminal observations, reset infos, float32 rewards, the single env's info dicts), and
SB3's PPO trains on it."""

from __future__ import annotations

import admit.envs  # noqa: F401  (registers the ids)
import numpy as np
import pytest
import torch
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import load_scenario
from admit.envs.vector import TenantAdmissionVectorEnv
from admit.train.vec import WorldsVecEnv
from stable_baselines3 import PPO
from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.vec_env import DummyVecEnv


def _same_info(a: dict, b: dict, where: str) -> None:
    assert set(a) == set(b), (where, sorted(set(a) ^ set(b)))
    for k in a:
        if isinstance(a[k], dict):
            _same_info(a[k], b[k], f"{where}/{k}")
        elif isinstance(a[k], np.ndarray):
            assert np.array_equal(a[k], b[k]), (where, k)
        else:
            assert a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]), (where, k, a[k], b[k])


@pytest.mark.parametrize("name", ["h200-mixed", "h200-azure-2023"])
def test_it_steps_as_dummy_vec_env_over_single_envs(name: str) -> None:
    sc = load_scenario(name, horizon_s=30.0)
    n = len(sc.tenants)
    check_env(TenantAdmissionEnv(scenario=sc))  # the single env it must agree with passes SB3's checker
    ours = WorldsVecEnv(TenantAdmissionVectorEnv(num_envs=3, scenario=sc))
    dummy = DummyVecEnv([lambda: TenantAdmissionEnv(scenario=sc) for _ in range(3)])
    ours.seed(21)
    dummy.seed(21)
    assert np.array_equal(ours.reset(), dummy.reset())
    for i in range(3):
        _same_info(ours.reset_infos[i], dummy.reset_infos[i], f"reset {i}")
    rng = np.random.default_rng(2)
    dones = 0
    for step in range(40):  # 15 decisions an episode, reset in the step that ends it
        a = rng.integers(0, 9, size=(3, n))
        o1, r1, d1, i1 = ours.step(a)
        o2, r2, d2, i2 = dummy.step(a)
        assert np.array_equal(o1, o2) and np.array_equal(r1, r2) and np.array_equal(d1, d2), step
        assert r1.dtype == r2.dtype == np.float32
        for i in range(3):
            _same_info(i1[i], i2[i], f"step {step} world {i}")
            if d1[i]:
                _same_info(ours.reset_infos[i], dummy.reset_infos[i], f"reset at {step} world {i}")
        dones += int(d1.sum())
    assert dones == 6  # every world ended twice, each time with terminal_observation and episode_metrics


def test_ppo_learns_on_it() -> None:
    torch.set_num_threads(1)
    vec = WorldsVecEnv(TenantAdmissionVectorEnv(num_envs=4, scenario=load_scenario("h200-mixed", horizon_s=20.0)))
    model = PPO("MlpPolicy", vec, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=128)
    assert model.num_timesteps == 128
    assert len(model.ep_info_buffer) == 0  # no Monitor: the episode figures come from the env's own info
    assert vec.get_attr("n_tenants") == [3, 3, 3, 3]
    assert vec.env_is_wrapped(object) == [False] * 4  # type: ignore[arg-type]


def test_it_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="runs a TenantAdmissionVectorEnv"):
        WorldsVecEnv(TenantAdmissionEnv(scenario="h200-mixed"))
    vec = WorldsVecEnv(TenantAdmissionVectorEnv(num_envs=2, scenario="h200-mixed"))
    with pytest.raises(AttributeError, match="set it on the vector env"):
        vec.set_attr("k", 3)
    vec.reset()
    with pytest.raises(ValueError, match=r"actions have shape \(2, 2\)"):
        vec.step(np.zeros((2, 2), dtype=np.int64))

import warnings

import gymnasium
import numpy as np
import pytest
from admit.envs.env import TenantAdmissionEnv
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

ENV_ID = "admit/TenantAdmission-v1"


def test_gymnasium_and_sb3_checkers_pass_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        env = gymnasium.make(ENV_ID, scenario="seed-paper")
        check_env(env.unwrapped)
        sb3_check_env(gymnasium.make(ENV_ID, scenario="seed-paper").unwrapped, warn=True)


def test_spaces_follow_the_scenario():
    env = gymnasium.make(ENV_ID, scenario="seed-paper")
    assert env.action_space == gymnasium.spaces.MultiDiscrete([3, 3])
    assert env.observation_space.shape == (5 + 2 * 27,)  # layout 2 (core/observation.py)


def _trajectory(seed, actions):
    env = TenantAdmissionEnv("seed-paper")
    obs, _ = env.reset(seed=seed)
    out = [obs]
    rewards = []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        out.append(obs)
        rewards.append(r)
    return np.array(out), np.array(rewards)


def test_same_seed_same_trajectory_different_seed_differs():
    actions = np.random.default_rng(0).integers(0, 3, size=(200, 2))
    o1, r1 = _trajectory(5, actions)
    o2, r2 = _trajectory(5, actions)
    o3, _ = _trajectory(6, actions)
    assert np.array_equal(o1, o2) and np.array_equal(r1, r2)
    assert not np.array_equal(o1, o3)


def test_episode_truncates_at_horizon_with_metrics_and_reward_terms():
    env = TenantAdmissionEnv("seed-paper")
    env.reset(seed=1)
    steps = 0
    while True:
        _, r, term, trunc, info = env.step(np.array([1, 1]))
        steps += 1
        assert not term
        assert r == pytest.approx(sum(info["reward_terms"].values()))
        if trunc:
            break
    assert steps == 600  # 1800 s / 3 s
    assert info["time_s"] == pytest.approx(1800.0)
    assert info["episode_metrics"]["throughput_rps"] > 0


def test_limits_are_clamped_to_bounds():
    env = TenantAdmissionEnv("seed-paper")
    env.reset(seed=0)
    for _ in range(10):
        _, _, _, _, info = env.step(np.array([2, 0]))  # +1 for tenant 0, −1 for tenant 1
    assert info["limits"] == [4, 1]  # seed-paper bounds are [1, 4]


@pytest.mark.parametrize(
    "action, message",
    [
        (np.array([1, 1, 1]), "shape"),
        (np.array([3, 0]), "out of range"),
        (np.array([-1, 0]), "out of range"),
        (np.array([0.5, 1.0]), "not integral"),
        ("up", "shape"),
    ],
)
def test_bad_actions_name_the_allowed_values(action, message):
    env = TenantAdmissionEnv("seed-paper")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=message) as e:
        env.step(action)
    assert "values in 0..2" in str(e.value)


def test_step_before_reset_and_unknown_scenario():
    with pytest.raises(RuntimeError, match="reset"):
        TenantAdmissionEnv("seed-paper").step(np.array([1, 1]))
    with pytest.raises(ValueError, match="unknown scenario"):
        gymnasium.make(ENV_ID, scenario="no-such-scenario")


def _make():
    return TenantAdmissionEnv("seed-paper")


@pytest.mark.parametrize("vec_cls", [DummyVecEnv, SubprocVecEnv])
def test_vectorised_envs(vec_cls):
    venv = vec_cls([_make, _make])
    try:
        venv.seed(11)
        obs = venv.reset()
        assert obs.shape == (2, 59)
        for _ in range(5):
            obs, rew, done, info = venv.step(np.array([[1, 1], [2, 0]]))
        assert obs.shape == (2, 59) and rew.shape == (2,)
        assert info[1]["limits"] == [4, 1]
    finally:
        venv.close()


def test_last_observation_is_the_one_behind_the_vector():
    """The env builds its Observation lazily from the step's values: same object as the simulator's own."""
    from admit.envs.simulation import Simulation

    env = TenantAdmissionEnv("seed-paper")
    vec, _ = env.reset(seed=4)
    sim = Simulation(env.scenario, 4)
    assert env.last_observation == sim.observe()
    for a in np.random.default_rng(1).integers(0, 3, size=(40, 2)):
        vec, _, _, _, info = env.step(a)
        sim.apply_deltas((a - 1).tolist())
        sim.advance(sim.now + env.scenario.interval_s)
        obs = sim.observe()
        assert env.last_observation == obs
        assert np.array_equal(vec, obs.to_vector())
        assert info["p99_s"] == max(t.e2e_p99 for t in obs.tenants)


def _seeded(i):
    from admit.envs.scenario import load_scenario
    from admit.train.wrappers import MakeEnv

    return MakeEnv(load_scenario("seed-paper"), "multidiscrete", 100 + i, 5)


@pytest.mark.parametrize(("workers", "trainer_block"), [(1, True), (2, False), (0, True)])
def test_block_vec_env_steps_like_dummy_vec_env(workers, trainer_block):
    """Same observations, rewards, dones, infos (terminal observation included) and reset infos as
    DummyVecEnv, through one auto-reset of every env; attribute access reaches the right env."""
    from admit.train.vec import BlockVecEnv
    from admit.train.wrappers import AlgoAction, EpisodeSeeds

    fns = [_seeded(i) for i in range(5)]
    block, dummy = BlockVecEnv(fns, workers=workers, trainer_block=trainer_block), DummyVecEnv(fns)
    try:
        assert len(block.processes) == workers
        assert np.array_equal(block.reset(), dummy.reset())
        assert block.reset_infos == dummy.reset_infos
        actions = np.random.default_rng(2).integers(0, 3, size=(601, 5, 2))
        ends = 0
        for a in actions:
            got, want = block.step(a), dummy.step(a)
            for x, y in zip(got[:3], want[:3], strict=True):
                assert x.dtype == y.dtype and np.array_equal(x, y)
            for gi, wi in zip(got[3], want[3], strict=True):
                if "terminal_observation" in wi:
                    ends += 1
                    assert np.array_equal(gi.pop("terminal_observation"), wi.pop("terminal_observation"))
                assert gi == wi
            assert block.reset_infos == dummy.reset_infos
        assert ends == 5  # 600 decisions per episode: every env reset once, on its own seed schedule
        assert block.get_attr("episode") == [2] * 5
        assert block.env_method("restart", indices=[4, 0]) == [None, None]
        assert block.get_attr("episode") == [0, 2, 2, 2, 0]
        block.set_attr("stride", 9, indices=[3])
        assert block.get_attr("stride", indices=[2, 3]) == [5, 9]
        assert block.env_is_wrapped(EpisodeSeeds) == [True] * 5
        assert block.env_is_wrapped(AlgoAction) == [False] * 5
        for _ in range(2):  # an env's error names its cause (a worker's comes as RuntimeError) and the next too
            with pytest.raises((ValueError, RuntimeError), match="out of range"):
                block.step(np.full((5, 2), 7))
    finally:
        block.close()
        dummy.close()
    assert all(not p.is_alive() for p in block.processes)

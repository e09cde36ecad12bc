"""The native vector env (envs/vector.py): N worlds in one kernel call give each world the episodes of a single
``TenantAdmissionEnv`` seeded alike, bit for bit, across autoresets, for worlds of one scenario and of several."""

from __future__ import annotations

from typing import Any

import admit.envs  # noqa: F401  (registers the ids)
import gymnasium as gym
import numpy as np
import pytest
from admit.envs.env import TenantAdmissionEnv
from admit.envs.registration import ENV_ID, scenario_env_id
from admit.envs.scenario import load_scenario
from admit.envs.vector import TenantAdmissionVectorEnv


def _short(name: str, horizon_s: float = 40.0):
    return load_scenario(name, horizon_s=horizon_s)


def _world_info(infos: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """World i's info out of Gymnasium's vector form (the keys whose mask holds for i), ``limits`` cut to its
    n tenants, as a single env returns it."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or not infos[f"_{key}"][i]:
            continue
        if isinstance(value, dict):
            out[key] = _world_info(value, i, n)
        elif key == "limits":
            out[key] = list(np.asarray(value[i])[:n]) if value.dtype != object else list(value[i])
        else:
            out[key] = value[i].item() if isinstance(value[i], np.generic) else value[i]
    return out


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), (where, sorted(set(a) ^ set(b)))
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert [int(x) for x in a] == [int(x) for x in b], where
    else:
        assert a == b or (a != a and b != b), (where, a, b)  # NaN equals NaN here


def test_make_vec_gives_the_native_env_and_its_spaces() -> None:
    env = gym.make_vec(scenario_env_id("h200-mixed"), num_envs=4, vectorization_mode="vector_entry_point")
    assert isinstance(env, TenantAdmissionVectorEnv)
    single = gym.make(scenario_env_id("h200-mixed")).unwrapped
    assert env.single_observation_space == single.observation_space
    assert env.single_action_space == single.action_space
    assert env.observation_space.shape == (4, *single.observation_space.shape)
    assert env.max_episode_steps == single.max_episode_steps  # the id's TimeLimit, passed to the vector env
    obs, info = env.reset(seed=3)
    assert obs.shape == (4, single.observation_space.shape[0]) and obs.dtype == np.float32
    assert info["episode_seed"].tolist() == [3, 4, 5, 6] and info["_episode_seed"].all()


@pytest.mark.parametrize("name", ["h200-mixed", "long-context-chat"])
def test_episodes_equal_sync_vector_env_of_single_envs_across_autoresets(name: str) -> None:
    """Against Gymnasium's SyncVectorEnv over single envs (the same NEXT_STEP autoreset): observations, rewards,
    terminations, truncations and every info value, step by step over three episodes of each world."""
    sc = _short(name)
    n = len(sc.tenants)
    ours = TenantAdmissionVectorEnv(num_envs=3, scenario=sc)
    sync = gym.vector.SyncVectorEnv([lambda: TenantAdmissionEnv(scenario=sc) for _ in range(3)])
    (o1, i1), (o2, i2) = ours.reset(seed=11), sync.reset(seed=11)
    assert np.array_equal(o1, o2)
    for i in range(3):
        _same(_world_info(i1, i, n), _world_info(i2, i, n), f"reset world {i}")
    rng = np.random.default_rng(0)
    truncations, seen = 0, set()
    for step in range(3 * 21):  # 20 decisions an episode, then the autoreset step
        a = rng.integers(0, 2 * ours.k + 1, size=(3, n))
        r1, r2 = ours.step(a), sync.step(a)
        for j, what in enumerate(("observations", "rewards", "terminated", "truncated")):
            assert np.array_equal(r1[j], r2[j]), (step, what)
        for i in range(3):
            _same(_world_info(r1[4], i, n), _world_info(r2[4], i, n), f"step {step} world {i}")
        truncations += int(r1[3].sum())
        seen |= set(r1[4])
    assert truncations == 9  # three episodes of three worlds, each ended by the horizon
    assert {"episode_metrics", "episode_seed"} <= seen  # the last steps' infos and the autoresets' were compared
    assert ("contract_misses" in seen) == sc.has_contracts


def test_worlds_of_different_scenarios_each_equal_their_own_single_env() -> None:
    """Worlds of 3, 2 and 8 tenants padded to 8: each world's rows equal its own single env's episode (seed 5 + i,
    then the seeds its generator draws), the padding is 0 and the actions past its tenants change nothing."""
    names = ["h200-mixed", "h200-azure-2023", "servegen-skewed"]
    scs = [_short(s, 30.0) for s in names]
    ours = TenantAdmissionVectorEnv(num_envs=3, scenario=scs)
    assert ours.n_tenants.tolist() == [3, 2, 8] and ours.n_max == 8
    singles = [TenantAdmissionEnv(scenario=sc) for sc in scs]
    obs, _ = ours.reset(seed=5)
    expect = [e.reset(seed=5 + i)[0] for i, e in enumerate(singles)]
    ended = [False] * 3
    rng = np.random.default_rng(1)
    for step in range(40):  # 15 decisions an episode: two autoresets each
        for i in range(3):
            m = expect[i].shape[0]
            assert np.array_equal(obs[i, :m], expect[i]), (step, i)
            assert not obs[i, m:].any()
        a = rng.integers(0, 2 * ours.k + 1, size=(3, 8))
        obs, rew, _, trunc, _ = ours.step(a)
        for i, e in enumerate(singles):
            n = len(scs[i].tenants)
            if ended[i]:
                expect[i], r, t = e.reset()[0], 0.0, False
            else:
                expect[i], r, _, t, _ = e.step(a[i, :n])
            ended[i] = t
            assert rew[i] == r and trunc[i] == t, (step, i)


def test_max_episode_steps_truncates_as_time_limit_does() -> None:
    """A ``max_episode_steps`` shorter than the horizon truncates where gymnasium.make's TimeLimit does."""
    ours = gym.make_vec(scenario_env_id("h200-mixed"), num_envs=2, vectorization_mode="vector_entry_point",
                        max_episode_steps=7)
    sync = gym.make_vec(scenario_env_id("h200-mixed"), num_envs=2, vectorization_mode="sync",
                        max_episode_steps=7)
    assert np.array_equal(ours.reset(seed=0)[0], sync.reset(seed=0)[0])
    a = np.full((2, 3), 4, dtype=np.int64)
    for step in range(17):
        r1, r2 = ours.step(a), sync.step(a)
        for j in range(4):
            assert np.array_equal(r1[j], r2[j]), (step, j)
        assert bool(r1[3].all()) == (step % 8 == 6)


def test_reset_mask_resets_only_the_worlds_masked() -> None:
    env = TenantAdmissionVectorEnv(num_envs=3, scenario=_short("h200-mixed"))
    env.reset(seed=0)
    obs, _, _, _, _ = env.step(np.full((3, 3), 8, dtype=np.int64))
    again, info = env.reset(seed=[None, 7, None], options={"reset_mask": np.array([False, True, False])})
    assert np.array_equal(again[[0, 2]], obs[[0, 2]])
    assert np.array_equal(again[1], TenantAdmissionEnv(scenario=_short("h200-mixed")).reset(seed=7)[0])
    assert info["_episode_seed"].tolist() == [False, True, False] and info["episode_seed"][1] == 7


def test_a_world_takes_another_scenario_at_its_next_reset() -> None:
    """``set_scenario`` (how a family's worlds will draw instances): the world's next episode is the new
    scenario's, its reward and info follow it; one with more tenants than the env was laid out for is refused."""
    env = TenantAdmissionVectorEnv(num_envs=2, scenario=[_short("servegen-skewed"), _short("h200-mixed")])
    env.reset(seed=0)
    env.set_scenario(1, _short("h200-azure-2023"))
    obs, info = env.reset(seed=[None, 9], options={"reset_mask": np.array([False, True])})
    single = TenantAdmissionEnv(scenario=_short("h200-azure-2023"))
    expect, _ = single.reset(seed=9)
    assert env.n_tenants.tolist() == [8, 2]
    assert np.array_equal(obs[1, :expect.shape[0]], expect) and not obs[1, expect.shape[0]:].any()
    a = np.full((2, 8), 4, dtype=np.int64)
    _, rew, _, _, infos = env.step(a)
    _, r, _, _, i1 = single.step(a[1, :2])
    assert rew[1] == r and infos["limits"][1, :2].tolist() == i1["limits"] and not infos["limits"][1, 2:].any()
    with pytest.raises(ValueError, match="8 tenants; this env takes max_step 4 and at most 3 tenants"):
        TenantAdmissionVectorEnv(num_envs=1, scenario="h200-mixed").set_scenario(0, "servegen-skewed")


@pytest.mark.parametrize(("actions", "message"), [
    (np.zeros((2, 2), dtype=np.int64), r"shape \(2, 2\); expected an integer array of shape \(2, 3\)"),
    (np.full((2, 3), 9, dtype=np.int64), r"actions\[0, 0\] = 9 is out of range; expected .*values in 0..8"),
    (np.full((2, 3), -1), r"actions\[0, 0\] = -1 is out of range"),
    (np.full((2, 3), 0.5), r"not integral"),
])
def test_bad_actions_are_refused_with_what_is_allowed(actions: np.ndarray, message: str) -> None:
    env = TenantAdmissionVectorEnv(num_envs=2, scenario=_short("h200-mixed"))
    env.reset(seed=0)
    before = env.world(0).now
    with pytest.raises(ValueError, match=message):
        env.step(actions)
    assert env.world(0).now == before  # nothing stepped


def test_bad_construction_and_resets_are_refused() -> None:
    with pytest.raises(ValueError, match="share limits.max_step.*1, 4"):
        TenantAdmissionVectorEnv(num_envs=2, scenario=["seed-paper", "h200-mixed"])
    with pytest.raises(ValueError, match="2 scenarios given for num_envs=3"):
        TenantAdmissionVectorEnv(num_envs=3, scenario=["h200-mixed", "h200-mixed"])
    with pytest.raises(ValueError, match="layout 2 only"):
        TenantAdmissionVectorEnv(num_envs=2, layout=1)
    with pytest.raises(gym.error.Error, match="doesn't have a vector entry point"):  # the -v0 ids vectorise by sync
        gym.make_vec("admit/TenantAdmission-v0", num_envs=2, vectorization_mode="vector_entry_point")
    with pytest.raises(ValueError, match="num_envs must be an integer >= 1"):
        TenantAdmissionVectorEnv(num_envs=0)
    env = TenantAdmissionVectorEnv(num_envs=2, scenario=_short("h200-mixed"))
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="first reset must reset every world"):
        env.reset(options={"reset_mask": np.array([True, False])})
    with pytest.raises(ValueError, match="reset_mask'\\] must be a bool array of shape \\(2,\\)"):
        env.reset(options={"reset_mask": np.array([1, 0])})
    with pytest.raises(ValueError, match="3 seeds given for 2 worlds"):
        env.reset(seed=[1, 2, 3])


def test_generic_id_takes_the_scenario_kwarg() -> None:
    env = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="vector_entry_point", scenario="h200-azure-2023")
    assert isinstance(env, TenantAdmissionVectorEnv) and env.n_tenants.tolist() == [2, 2]
    assert env.max_episode_steps is None

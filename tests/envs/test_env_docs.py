"""The env's documentation is Gymnasium's kind: one class docstring with fixed sections, an observation table
that follows the layout, doctests that run, and registrations whose step counts are the env's own."""

from __future__ import annotations

import doctest
import inspect
import math
import re
import warnings

import admit.core.observation as layout
import admit.envs.env as env_module
import gymnasium
import numpy as np
import pytest
from admit.envs.env import FEATURES, TenantAdmissionEnv, observation_table
from admit.envs.registration import ENV_ID, ENV_ID_V0, scenario_env_id
from admit.envs.scenario import bundled_scenarios, load_scenario
from admit.envs.simulation import decision_count
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

SECTIONS = ("Description", "Action Space", "Observation Space", "Rewards", "Starting State", "Episode End",
            "Arguments", "Vectorized environment", "Version History")


def test_help_shows_gymnasiums_sections_in_order() -> None:
    doc = type(gymnasium.make(ENV_ID).unwrapped).__doc__
    assert doc is not None
    at = [doc.find(f"\n    ## {s}\n") for s in SECTIONS]
    assert all(i >= 0 for i in at), [s for s, i in zip(SECTIONS, at, strict=True) if i < 0]
    assert at == sorted(at)
    assert "## Description" in inspect.getdoc(gymnasium.make(ENV_ID).unwrapped)  # what help() prints
    assert len(env_module.__doc__.splitlines()) < 10  # the module docstring only points at the class's


def test_the_doctests_pass() -> None:
    result = doctest.testmod(env_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 10 and result.failed == 0, result


def _table_rows(doc: str) -> list[list[str]]:
    text = inspect.cleandoc(doc)
    block = text[text.index("## Observation Space") : text.index("## Rewards")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if line.startswith("|")]
    assert rows[0] == ["Num", "Feature", "Unit", "Min", "Max"]
    return rows[2:]  # past the header and its rule


def test_the_observation_table_is_the_layout() -> None:
    doc = TenantAdmissionEnv.__doc__
    assert observation_table() in inspect.cleandoc(doc)  # the docstring's table is the generated one, verbatim
    assert set(FEATURES) == set(layout.GLOBAL_FEATURES) | set(layout.TENANT_FEATURES)
    rows = _table_rows(doc)
    names = [r[1].strip("`") for r in rows]
    assert names == [*layout.GLOBAL_FEATURES, *layout.TENANT_FEATURES]  # every feature, in vector order
    # the Num column says where each feature sits in the vector, for every tenant i
    env = TenantAdmissionEnv("seed-paper")
    obs, _ = env.reset(seed=0)
    feature_names = layout.Observation.feature_names([t.name for t in env.scenario.tenants])
    for num, name in ((r[0], r[1].strip("`")) for r in rows):
        for i in range(env.n):
            index = int(eval(num.replace("·", "*"), {"i": i}))  # "3 + 17·i + 2"
            assert feature_names[index].split(".")[-1] == name
            if index < len(layout.GLOBAL_FEATURES):
                break
    for name in names:  # units come from the layout's own docs: the feature is listed there
        assert name in layout.__doc__, name
    for unit, lo, hi in FEATURES.values():
        assert unit and lo and hi
    assert f"{layout.FEATURE_MAX:.0e}".replace("e+0", "e") == "1e6" and layout.NO_SLO == 1e4  # as the doc writes them
    space = env.observation_space
    assert float(space.low.min()) == 0.0 and float(space.high.max()) == layout.FEATURE_MAX


def test_a_feature_added_to_the_layout_but_not_the_table_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_module, "TENANT_FEATURES", (*layout.TENANT_FEATURES, "kv_blocks"))
    with pytest.raises(KeyError, match="kv_blocks"):
        observation_table()
    monkeypatch.setitem(FEATURES, "kv_blocks", ("blocks", "0", "1e6"))
    assert observation_table() not in inspect.cleandoc(TenantAdmissionEnv.__doc__)  # the docstring must follow


def test_the_generic_id_has_no_time_limit_and_says_its_length() -> None:
    env = gymnasium.make(ENV_ID, scenario="h200-live-small")
    assert env.spec.max_episode_steps is None and "TimeLimit" not in str(env)
    assert env.unwrapped.max_episode_steps == 60
    assert gymnasium.make(ENV_ID, scenario="seed-paper").unwrapped.max_episode_steps == 600


@pytest.mark.parametrize("name", bundled_scenarios())
def test_a_scenarios_id_truncates_exactly_where_its_horizon_does(name: str) -> None:
    sc = load_scenario(name)
    env = gymnasium.make(scenario_env_id(name))
    steps = env.spec.max_episode_steps
    assert steps == env.unwrapped.max_episode_steps == decision_count(sc) == math.ceil(sc.horizon_s / sc.interval_s)
    assert env.spec.kwargs == {"scenario": name, "layout": 2} and env.unwrapped.scenario == sc
    env.reset(seed=0)
    hold = np.full(env.action_space.shape, sc.limits.max_step, dtype=np.int64)
    for k in range(1, steps + 1):
        _, _, terminated, truncated, info = env.step(hold)
        assert not terminated
        assert truncated == (k == steps), k
        # the env's own truncation (it alone adds the episode metrics) falls on the TimeLimit's step
        assert ("episode_metrics" in info) == (k == steps), k
    assert info["time_s"] == pytest.approx(sc.horizon_s)


def test_decision_count_follows_the_float_arithmetic_of_a_step() -> None:
    for horizon, interval in ((100.0, 3.0), (0.3, 0.1), (1800.0, 3.0), (10.0, 2.5), (7.0, 10.0)):
        sc = load_scenario("seed-paper", horizon_s=horizon, interval_s=interval)
        env = TenantAdmissionEnv(sc)
        env.reset(seed=0)
        n = 0
        while True:
            n += 1
            if env.step(np.array([1, 1]))[3]:
                break
        assert n == env.max_episode_steps == decision_count(sc), (horizon, interval)


def test_checkers_pass_on_a_scenarios_id_without_warnings() -> None:
    env_id = scenario_env_id("h200-live-small")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        check_env(gymnasium.make(env_id).unwrapped)  # Gymnasium's checker wants the env itself
        sb3_check_env(gymnasium.make(env_id), warn=True)  # SB3's runs it with its TimeLimit


def test_every_bundled_scenario_has_an_id() -> None:
    ids = {k for k in gymnasium.registry if k.startswith("admit/")}
    generic = {ENV_ID, ENV_ID_V0}
    assert ids == generic | {scenario_env_id(n, v) for n in bundled_scenarios() for v in (0, 1)}
    assert all(re.fullmatch(r"admit/TenantAdmission-[\w.-]+-v[01]", i) for i in ids - generic)
    for i in ids:  # Gymnasium reads the scenario into the name, v0/v1 as the version; v0 is layout 1
        spec = gymnasium.registry[i]
        assert spec.namespace == "admit" and spec.kwargs["layout"] == {0: 1, 1: 2}[spec.version]

"""Property tests: observations stay finite and inside the space for any actions and extreme loads."""

import numpy as np
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import load_scenario, parse_scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def scenario_with_load(rate_scale: float, timeout: float, max_queue: int, slots: int):
    d = load_scenario("seed-paper").model_dump()
    d["horizon_s"] = 120
    d["engine"]["slots"] = slots
    d["admission"] = {"queue_timeout_s": timeout, "max_queue": max_queue}
    d["tenants"][0]["arrival"]["rate_on"] *= rate_scale
    d["tenants"][1]["arrival"]["rate"] *= rate_scale
    return parse_scenario(d)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate_scale=st.sampled_from([0.01, 1.0, 30.0, 300.0]),
    timeout=st.sampled_from([0.01, 3.0, 1e6]),
    max_queue=st.sampled_from([0, 5, 1_000_000]),
    slots=st.sampled_from([1, 8]),
    seed=st.integers(0, 2**16),
    actions=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=40, max_size=40),
)
def test_observations_finite_and_in_space(rate_scale, timeout, max_queue, slots, seed, actions):
    env = TenantAdmissionEnv(scenario_with_load(rate_scale, timeout, max_queue, slots))
    obs, _ = env.reset(seed=seed)
    assert env.observation_space.contains(obs)
    for a in actions:
        obs, r, term, trunc, info = env.step(np.array(a))
        assert np.all(np.isfinite(obs)) and env.observation_space.contains(obs)
        assert np.isfinite(r)
        lim = info["limits"]
        assert all(1 <= x <= 4 for x in lim)
        if trunc:
            break

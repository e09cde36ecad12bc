"""One decision loop (`Simulation.run`, one interval = `Simulation.step`) and one clamp (`Limits.apply`).

The evaluator, sim2live and the env all decide through these, so the tests pin them against the loop they
replaced, written out by hand: observe → act → validate → current + delta clamped → advance one interval.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from admit.core.controller import validate_deltas
from admit.core.observation import Observation
from admit.core.spec import ControlSpec, Limits
from admit.envs.scenario import load_scenario
from admit.envs.simulation import Simulation, draw_requests
from hypothesis import given
from hypothesis import strategies as st


class RandomDeltas:
    """A controller that moves every limit at random, from its own seed: it reaches both bounds often."""

    name = "random"

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.k = spec.limits.max_step
        self.n = spec.n_tenants
        self.rng = np.random.default_rng(seed)

    def act(self, obs: Observation) -> list[int]:
        return self.rng.integers(-self.k, self.k + 1, size=self.n).tolist()


@given(
    lo=st.integers(0, 5),
    span=st.integers(0, 10),
    current=st.lists(st.integers(-20, 40), min_size=1, max_size=6),
    data=st.data(),
)
def test_limits_apply_is_current_plus_delta_clamped(lo, span, current, data):
    lim = Limits(min=lo, max=lo + span, initial=lo)
    deltas = data.draw(st.lists(st.integers(-30, 30), min_size=len(current), max_size=len(current)))
    got = lim.apply(current, deltas)
    assert got == [min(max(c + d, lim.min), lim.max) for c, d in zip(current, deltas, strict=True)]
    assert all(type(x) is int for x in got)


def test_limits_apply_wants_one_delta_per_limit():
    with pytest.raises(ValueError):
        Limits().apply([4, 4], [1])


def _hand_loop(sim: Simulation, ctrl: RandomDeltas, until: float) -> tuple[list[float], float, int]:
    """The loop as evaluate/offline.py and live/sim2live.py wrote it before `Simulation.run`."""
    times, limit_sum, steps, t = [], 0.0, 0, 0.0
    while t < until - 1e-9:
        obs = sim.observe()
        deltas = validate_deltas(ctrl.act(obs), sim.spec)
        times.append(t)
        limit_sum += sum(sim.apply_deltas(deltas))
        steps += 1
        t = min(t + sim.scenario.interval_s, until)
        sim.advance(t)
    return times, limit_sum, steps


@pytest.mark.parametrize("extra_s", [0.0, 40.0])
def test_run_is_the_hand_written_loop(extra_s):
    sc = load_scenario("seed-paper", horizon_s=200)
    until = sc.horizon_s + extra_s  # past the horizon: no arrivals, the queues drain
    a, b = Simulation(sc, 7), Simulation(sc, 7)
    ca, cb = RandomDeltas(), RandomDeltas()
    ca.reset(sc.control_spec(), 7)
    cb.reset(sc.control_spec(), 7)
    times, limit_sum, steps = _hand_loop(a, ca, until)
    seen: list[tuple[float, list[int], list[int], list[int]]] = []
    stats = b.run(cb, until=until if extra_s else None,
                  on_decision=lambda t, obs, d, lim: seen.append((t, [int(x.limit) for x in obs.tenants], d, lim)))
    assert b.now == a.now == until
    assert b.summary() == a.summary() and b.limits == a.limits
    assert stats.decisions == steps == len(seen) == math.ceil(until / sc.interval_s)
    assert stats.limit_sum == limit_sum
    assert stats.mean_limit == limit_sum / steps / len(sc.tenants)
    assert [s[0] for s in seen] == times
    for (_, before, deltas, after), (_, nxt, _, _) in itertools.pairwise(seen):
        assert after == sc.control_spec().limits.apply(before, deltas) == nxt  # the limits obs sees next
    assert {x for s in seen for x in s[3]} >= {1, 4}  # it went to both bounds of seed-paper


def test_env_step_is_one_simulation_step():
    from admit.envs.env import TenantAdmissionEnv

    env = TenantAdmissionEnv("seed-paper")
    env.reset(seed=2)
    sim = Simulation(env.scenario, 2)
    for a in np.random.default_rng(3).integers(0, 3, size=(50, 2)):
        _, _, _, _, info = env.step(a)
        assert info["limits"] == sim.step((a - 1).tolist())
        assert env.sim is not None and env.sim.now == sim.now
    assert env.sim.summary() == sim.summary()


def test_a_bad_policy_names_itself_and_the_decision_time():
    sc = load_scenario("seed-paper", horizon_s=30)

    class Bad(RandomDeltas):
        name = "bad"

        def act(self, obs: Observation) -> list[int]:
            return [5, 0] if obs.time_s > 10 else [0, 0]

    ctrl = Bad()
    ctrl.reset(sc.control_spec(), 0)
    with pytest.raises(ValueError, match=r"^policy 'bad' at t=12\.0s: every delta must be an integer in \[-1, 1\]"):
        Simulation(sc, 0).run(ctrl)
    with pytest.raises(ValueError, match=r"^policy 'bad:v2' at t=12\.0s"):
        Simulation(sc, 0).run(ctrl, name="bad:v2")


def test_handed_requests_are_run_as_given_and_left_untouched():
    sc = load_scenario("seed-paper", horizon_s=120)
    drawn = draw_requests(sc, 4)
    own = Simulation(sc, 4)
    assert [(r.rid, r.tenant, r.arrival) for r in own.requests] == [(r.rid, r.tenant, r.arrival) for r in drawn]
    handed = Simulation(sc, 4, requests=drawn)
    for sim in (own, handed):
        ctrl = RandomDeltas()
        ctrl.reset(sim.spec, 4)
        sim.run(ctrl)
    assert handed.summary() == own.summary()
    assert all(math.isnan(r.finished) for r in drawn)  # copied: the caller's requests are not used up
    assert sum(not math.isnan(r.finished) for r in handed.requests) == handed.summary()["completed"]
    later = Simulation(sc, 4, requests=drawn[len(drawn) // 2 :])  # a subset: only those arrive
    later.advance(sc.horizon_s)
    assert later.summary()["arrived"] == len(drawn) - len(drawn) // 2
    with pytest.raises(ValueError, match="arrival order"):
        Simulation(sc, 4, requests=drawn[::-1])
    with pytest.raises(ValueError, match="tenant 2"):
        Simulation(sc, 4, requests=[type(drawn[0])(0, 2, 0.0, 1, 1, 0.5)])

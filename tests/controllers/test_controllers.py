import pytest
from admit.agents.registry import make_controller
from admit.controllers.differentiated import DifferentiatedController
from admit.controllers.naive import NaiveController
from admit.controllers.static import StaticController
from admit.core.controller import validate_deltas
from admit.core.observation import Observation, TenantObservation
from admit.envs.scenario import load_scenario

SPEC = load_scenario("seed-paper").control_spec()


def obs(*tenants, mem=0.0):
    return Observation(0.0, 6.0, mem, 0, 0, [TenantObservation(**t) for t in tenants])


def test_naive_throttles_everyone_when_one_tenant_is_slow():
    c = NaiveController()
    c.reset(SPEC)
    o = obs({"e2e_p99": 7.0, "limit": 4, "in_flight": 1}, {"e2e_p99": 1.0, "limit": 4, "in_flight": 0})
    assert c.act(o) == [-1, -1]


def test_naive_grows_when_slots_idle_and_throttles_when_full():
    c = NaiveController()
    idle = obs({"limit": 4, "in_flight": 1}, {"limit": 4, "in_flight": 1})
    full = obs({"limit": 2, "in_flight": 2}, {"limit": 2, "in_flight": 2})
    middle = obs({"limit": 4, "in_flight": 3}, {"limit": 4, "in_flight": 2})
    assert c.act(idle) == [1, 1]
    assert c.act(full) == [-1, -1]
    assert c.act(middle) == [0, 0]


def test_differentiated_decides_per_tenant():
    c = DifferentiatedController()
    o = obs(
        {"queue_depth": 3, "limit": 2, "in_flight": 2, "e2e_p99": 9.0},  # backlog 1.5 > 1: grow
        {"queue_depth": 0, "limit": 3, "in_flight": 1, "e2e_p99": 2.0},  # no backlog: give one back
        {"queue_depth": 1, "limit": 2, "in_flight": 2, "e2e_p99": 7.0},  # slow, small backlog: throttle
        {"queue_depth": 1, "limit": 2, "in_flight": 2, "e2e_p99": 2.0},  # small backlog, fine: hold
    )
    assert c.act(o) == [1, -1, -1, 0]


def test_static_holds_or_walks_to_its_cap():
    c = StaticController()
    c.reset(SPEC)
    assert c.act(obs({"limit": 4}, {"limit": 4})) == [0, 0]
    c = make_controller("static:2")
    c.reset(SPEC)
    assert c.act(obs({"limit": 4}, {"limit": 1})) == [-1, 1]


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown policy 'bogus'.*naive"):
        make_controller("bogus")
    with pytest.raises(ValueError, match="takes no argument"):
        make_controller("naive:3")
    c = make_controller("static:1,2,3")
    with pytest.raises(ValueError, match="expected 2 values"):
        c.reset(SPEC)


def test_validate_deltas():
    assert validate_deltas([1, -1], SPEC) == [1, -1]
    with pytest.raises(ValueError, match="expected 2 deltas"):
        validate_deltas([1], SPEC)
    with pytest.raises(ValueError, match=r"integer in \[-1, 1\]"):
        validate_deltas([2, 0], SPEC)
    with pytest.raises(ValueError, match=r"integer in \[-1, 1\]"):
        validate_deltas([0.5, 0], SPEC)

"""Excess goodput, borrowed and lent concurrency of an episode (envs/contracts.py ``episode_lending``): read
after the run from the world's request columns, the same in both worlds, consistent with the episode's own
counts and with the admission core's requests in flight at each decision, and absent without contracts."""

from __future__ import annotations

import numpy as np
import pytest
from admit.agents.registry import make_controller
from admit.core.contract import lending, nominal_concurrency
from admit.envs.compiled import make_simulation
from admit.envs.contracts import episode_lending
from admit.envs.rollout import rollout
from admit.envs.scenario import Scenario, load_scenario, parse_scenario
from admit.envs.simulation import RequestColumns, Simulation, decision_count, decision_times
from admit.evaluate.offline import evaluate
from contract_helpers import AGENT, CHAT, run_in_both_worlds
from hypothesis import given, settings
from hypothesis import strategies as st


def _uncontracted(name: str) -> Scenario:
    """Bundled scenario ``name`` with any contracts its file gives taken off."""
    data = load_scenario(name).model_dump(exclude_none=True)
    for t in data["tenants"]:
        t.pop("contract", None)
    return parse_scenario(data, f"{name} without contracts")


def _contracted(contracts: dict | None = None) -> Scenario:
    """h200-live-small with these contracts (default: the shared CHAT and AGENT) and no others."""
    data = _uncontracted("h200-live-small").model_dump(exclude_none=True)
    for t in data["tenants"]:
        if t["name"] in (contracts or {"chat": CHAT, "agent": AGENT}):
            t["contract"] = (contracts or {"chat": CHAT, "agent": AGENT})[t["name"]]
    return parse_scenario(data, "h200-live-small with contracts")


def test_decision_times_are_the_decisions_the_loop_makes() -> None:
    sc = _contracted()
    times = decision_times(sc)
    assert len(times) == decision_count(sc) and times[0] == 0.0 and times[-1] < sc.horizon_s
    seen: list[float] = []
    sim = make_simulation(sc, 0)
    sim.run(make_controller("static:4"), on_decision=lambda t, *_: seen.append(t))
    assert times.tolist() == seen


@pytest.mark.parametrize("policy", ["static:3", "aimd"])
def test_in_flight_at_each_decision_is_the_admission_cores_once_the_decision_is_applied(policy: str) -> None:
    sc = _contracted()
    sim = Simulation(sc, 2)
    ctrl = make_controller(policy, sc)
    ctrl.reset(sc.control_spec(), 2)
    core_counts = []
    while not sim.done:
        sim.apply_deltas(ctrl.act(sim.observe()))
        core_counts.append([sim.core.in_flight(k) for k in range(len(sc.tenants))])
        sim.advance_interval()
    got = sim.request_columns().in_flight(len(sc.tenants), decision_times(sc))
    assert got.tolist() == core_counts and got.max() > 0


@pytest.mark.parametrize("policy", ["static:share", "aimd", "kueue-borrow"])
def test_both_worlds_give_the_same_figures_bit_for_bit(policy: str) -> None:
    sc = _contracted()
    got = {world: episode_lending(sc, sim.request_columns(), decision_times(sc))
           for world, sim in run_in_both_worlds(sc, policy, 4).items()}
    (per, series), (per_c, series_c) = got["python"], got["compiled"]
    assert per == per_c and series["nominal"] == series_c["nominal"]
    assert series["time_s"].tobytes() == series_c["time_s"].tobytes()
    for key in ("in_flight", "borrowed", "lent"):
        for t in ("chat", "agent"):
            assert series[key][t].tobytes() == series_c[key][t].tobytes(), (key, t)
    assert set(per) == {"chat", "agent"} and all(np.isfinite(list(f.values())).all() for f in per.values())


def test_an_episodes_figures_agree_with_its_counts_and_its_series() -> None:
    sc = _contracted()
    ep = rollout(sc, make_controller("static:2"), 1)
    series = ep["lending"]
    n = decision_count(sc)
    assert len(series["time_s"]) == n
    nominal = nominal_concurrency(sc.control_spec())
    assert series["nominal"] == {"chat": nominal[0], "agent": nominal[1]}
    in_flight = np.array([series["in_flight"][t] for t in ("chat", "agent")]).T
    borrowed, lent = lending(in_flight, nominal)
    for k, t in enumerate(("chat", "agent")):
        te = ep["tenants"][t]
        assert series["borrowed"][t].tolist() == borrowed[:, k].tolist()
        assert series["lent"][t].tolist() == lent[:, k].tolist()
        assert te["borrowed"] == pytest.approx(np.mean(series["borrowed"][t]))
        assert te["lent"] == pytest.approx(np.mean(series["lent"][t]))
        # good requests are in contract or in excess, and never more than the limit of 2 in flight
        assert te["excess_goodput"] * sc.horizon_s + te["contract_good"] == pytest.approx(te["good"])
        assert max(series["in_flight"][t]) <= 2


def test_a_tenant_without_a_contract_borrows_all_it_runs_and_all_its_goodput_is_excess() -> None:
    sc = _contracted({"chat": CHAT})
    ep = rollout(sc, make_controller("static:8"), 0)
    agent = ep["tenants"]["agent"]
    assert ep["lending"]["nominal"]["agent"] == 0 and agent["lent"] == 0.0
    assert agent["borrowed"] == pytest.approx(np.mean(ep["lending"]["in_flight"]["agent"])) and agent["borrowed"] > 0
    assert agent["excess_goodput"] == pytest.approx(agent["goodput_rps"])


def test_a_warm_up_leaves_its_decisions_and_requests_out() -> None:
    sc = _contracted()
    sim = Simulation(sc, 3, warmup_s=40.0)
    sim.run(make_controller("static:2"))
    cols = sim.request_columns()
    times = decision_times(sc)
    per, series = episode_lending(sc, cols, times, 40.0)
    after = times >= 40.0
    for t in ("chat", "agent"):
        assert per[t]["borrowed"] == pytest.approx(np.mean(np.array(series["borrowed"][t])[after]))
    whole, _ = episode_lending(sc, cols, times)
    assert per["chat"]["excess_goodput"] * (sc.horizon_s - 40.0) <= whole["chat"]["excess_goodput"] * sc.horizon_s


@pytest.mark.parametrize("name", ["h200-live-small", "h200-mixed"])
def test_without_contracts_there_are_no_such_figures(name: str) -> None:
    sc = _uncontracted(name)
    ep = rollout(sc, make_controller("static"), 0)
    assert "lending" not in ep
    assert not any(k in te for te in ep["tenants"].values() for k in ("excess_goodput", "borrowed", "lent"))
    assert episode_lending(sc, make_simulation(sc, 0).request_columns(), decision_times(sc)) == ({}, {})


def test_an_evaluation_carries_them_per_tenant_with_their_spread() -> None:
    data = evaluate(_contracted(), ["static:share", "static:2"], seeds=3).to_json()
    for p in data["policies"].values():
        for t in ("chat", "agent"):
            te = p["tenants"][t]
            for m in ("excess_goodput", "borrowed", "lent"):
                assert set(te[m]) >= {"mean", "ci95", "values"} and len(te[m]["values"]) == 3
                assert m in te["p_value_vs_first"]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_in_flight_counts_admitted_and_unfinished_requests_at_each_time(data: st.DataObject) -> None:
    """Against the definition, request by request: times on a grid, so admissions and finishes fall exactly on
    decision times too; NaN for never admitted or never finished."""
    n_tenants = data.draw(st.integers(1, 4))
    grid = st.integers(0, 40).map(lambda x: x * 0.5)
    rows = data.draw(st.lists(st.tuples(st.integers(0, n_tenants - 1), st.one_of(st.none(), grid),
                                        st.one_of(st.none(), grid)), max_size=60))
    tenant = np.array([r[0] for r in rows], dtype=np.int64)
    start = np.array([np.nan if r[1] is None else r[1] for r in rows])
    end = np.array([np.nan if r[1] is None or r[2] is None else r[1] + r[2] for r in rows])
    cols = RequestColumns(tenant, np.zeros(len(rows)), np.ones(len(rows), dtype=np.int64),
                          np.ones(len(rows), dtype=np.int64), end, end, start)
    times = np.arange(0.0, 25.0, 1.5)
    want = [[sum(1 for k, a, b in zip(tenant, start, end, strict=True)
                 if k == j and a <= t and not b <= t) for j in range(n_tenants)] for t in times]
    assert cols.in_flight(n_tenants, times).tolist() == want

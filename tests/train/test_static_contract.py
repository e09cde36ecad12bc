"""static:contract: the static caps with the most goodput among those that keep every contract on the tuning
seeds (train/static_search.py, objective "contract"), stored apart from static:best's and deployed by the
registry's ``static:contract``."""

from __future__ import annotations

import json

import pytest
from admit.agents import static_best as best
from admit.agents.registry import make_controller
from admit.envs.rollout import rollout
from admit.envs.scenario import Scenario, load_scenario, parse_scenario
from admit.train import static_search as search
from contract_helpers import without_contracts

SEEDS = [900000, 900001]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every search made on the fly goes to this test's own cache, on one worker."""
    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ADMIT_SEARCH_WORKERS", "1")
    best._RESOLVED.clear()


def promised(attainment: float) -> Scenario:
    """long-context-chat's first 300 s with a contract for the long-context tenant, which the caps with the most
    goodput serve worse than they could (they favour the cheaper chat requests)."""
    d = without_contracts("long-context-chat").model_dump(exclude_none=True, mode="json")
    d["name"], d["horizon_s"] = "long-context-chat-promised", 300  # its own name: no shipped tuning is its
    d["tenants"][0]["contract"] = {"requests_per_s": 0.2, "burst": 2, "attainment": attainment}
    return parse_scenario(d, "long-context-chat with a contract")


def in_contract(result: search.SearchResult, caps: tuple[int, ...]) -> float:
    result.objective([caps])  # runs them on the search's seeds if it has not
    return result.objective.contracts(caps)["long-context"]["contract_attainment"]


def test_the_search_under_contracts_keeps_the_promise_the_blind_one_breaks() -> None:
    """The promise is set between what the blind caps give the tenant and the most any caps give it (the search
    under a promise of 1.0 finds those), so the blind caps break it and some caps keep it."""
    blind = search.search_static(promised(0.5), SEEDS, 1, objective="goodput", measure_ramp=False)
    most = search.search_static(promised(1.0), SEEDS, 1, objective="contract", measure_ramp=False)
    low, high = in_contract(most, blind.best), in_contract(most, most.best)
    assert high > low + 0.02, (low, high)  # the blind caps leave room
    sc = promised(round((low + high) / 2, 4))
    kept = search.search_static(sc, SEEDS, 1, objective="contract", measure_ramp=False)
    judge = kept.objective
    judge([blind.best])
    assert not judge.contracts(blind.best)["long-context"]["contract_met"]
    assert judge.contracts(kept.best)["long-context"]["contract_met"]
    assert judge.mean(kept.best) <= blind.objective.mean(blind.best)  # the promise costs goodput, if anything
    data = kept.to_json("test")
    assert data["searched_for"] == "contract" and data["contracts_met"] == data["contracts_total"] == 1
    assert data["contracts"]["long-context"]["contract"]["attainment"] == round((low + high) / 2, 4)
    assert data["fingerprint"] == search.fingerprint(sc, "contract") != search.fingerprint(sc)


def test_a_scenario_without_contracts_is_refused_and_its_fingerprint_is_unchanged() -> None:
    sc = load_scenario("seed-paper")
    with pytest.raises(ValueError, match="has no contracts to search under"):
        search.search_static(sc, SEEDS, 1, objective="contract")
    shipped = [json.loads(p.read_text()) for p in best.shipped_dir().glob("*.json")]
    stored = next(d for d in shipped if d["scenario"] == "seed-paper")
    assert search.fingerprint(sc) == stored["fingerprint"]  # the blind search's stores are found as before


def test_static_contract_searches_on_the_fly_deploys_and_refuses_its_own_seeds(capsys) -> None:
    sc = promised(0.7)
    ctrl = make_controller("static:contract", scenario=sc)
    ep = rollout(sc, ctrl, 3)
    assert ctrl.name == "static:contract" and "static:contract: no tuned caps" in capsys.readouterr().err
    tuned = best.tuned_caps(sc, objective="contract")
    assert tuned.path.parent == best.cache_dir("contract") and list(tuned.caps) == ctrl.cap
    assert ep["tenants"]["long-context"]["contract_arrived"] > 0
    with pytest.raises(ValueError, match="static:contract's caps .* were tuned on seeds"):
        make_controller("static:contract", scenario=sc).reset(sc.control_spec(), 900000)


def test_more_promises_kept_outrank_a_smaller_shortfall_which_outranks_goodput() -> None:
    """The search's score: caps that keep one of two promises (short by 50 requests on the other) beat caps that
    break both by a request each, which beat the same with more goodput but a larger shortfall."""
    d = load_scenario("h200-live-small").model_dump(exclude_none=True, mode="json")
    for t in d["tenants"]:
        t["contract"] = {"requests_per_s": 1.0, "burst": 2, "attainment": 0.9}
    sc = parse_scenario(d, "two contracts")
    ob = search.SimObjective(sc, [0], None, 1, objective="contract")

    def put(caps: tuple[int, int], goodput: float, good: tuple[int, int]) -> None:
        tenants = {name: {"contract_arrived": 100.0, "contract_good": float(g)}
                   for name, g in zip(("chat", "agent"), good, strict=True)}
        ob.episodes[(caps, 0)] = {"goodput_rps": goodput, "tenants": tenants}

    put((1, 1), 1.0, (90, 40))  # chat kept, agent 50 short
    put((2, 2), 9.0, (89, 89))  # both broken, a request short each
    put((3, 3), 9.5, (88, 88))  # both broken, two short each, more goodput
    assert ob.score((1, 1)) > ob.score((2, 2)) > ob.score((3, 3))

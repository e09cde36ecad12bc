"""static:contract-stale: static:contract's caps tuned on the scenario's last-week sibling (envs/family.py
``last_week``) and deployed on this week's traffic."""

from __future__ import annotations

import pytest
from admit.agents import static_best as best
from admit.agents.registry import make_controller
from admit.envs.family import LAST_WEEK, last_week
from admit.envs.rollout import rollout
from admit.envs.scenario import Scenario, load_scenario, parse_scenario
from admit.train import static_search as search


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every search made on the fly goes to this test's own cache, on one worker."""
    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ADMIT_SEARCH_WORKERS", "1")
    best._RESOLVED.clear()


def promised() -> Scenario:
    """long-context-chat's first 120 s with a contract on each tenant (a quick search)."""
    d = load_scenario("long-context-chat").model_dump(exclude_none=True, mode="json")
    d["horizon_s"] = 120
    d["tenants"][0]["contract"] = {"requests_per_s": 0.2, "burst": 2, "attainment": 0.7}
    d["tenants"][1]["contract"] = {"requests_per_s": 1.0, "burst": 5, "attainment": 0.7}
    return parse_scenario(d, "long-context-chat with contracts")


def test_stale_caps_come_from_the_last_week_sibling_and_deploy_on_this_week(capsys) -> None:
    sc = promised()
    ctrl = make_controller("static:contract-stale", scenario=sc)
    assert ctrl.name == "static:contract-stale"
    ep = rollout(sc, ctrl, 3)
    err = capsys.readouterr().err
    assert f"no tuned caps for '{sc.name}{LAST_WEEK}'" in err  # it searched the sibling, not this week
    sibling = last_week(sc)
    assert search.fingerprint(sibling, "contract") != search.fingerprint(sc, "contract")
    stale = best.tuned_caps(sibling, objective="contract")
    assert stale.scenario == sibling.name and stale.fingerprint == search.fingerprint(sibling, "contract")
    assert isinstance(ctrl, best.StaleContractStatic) and ctrl.tuned == stale and ctrl.cap == list(stale.caps)
    assert ep["contracts"] == 2 and all(t["contract_arrived"] > 0 for t in ep["tenants"].values())
    # a second one finds the sibling's caps stored (by its fingerprint) and does not search again
    best._RESOLVED.clear()
    again = make_controller("static:contract-stale", scenario=sc)
    again.reset(sc.control_spec(), 4)
    assert again.cap == ctrl.cap and "searching now" not in capsys.readouterr().err
    with pytest.raises(ValueError, match="static:contract-stale's caps .* were tuned on seeds"):
        make_controller("static:contract-stale", scenario=sc).reset(sc.control_spec(), 900000)


def test_unknown_static_argument_names_contract_stale() -> None:
    with pytest.raises(ValueError, match="'contract-stale'"):
        make_controller("static:nope")


def test_check_seeds_refuses_the_seeds_the_last_week_sibling_was_tuned_on() -> None:
    """static:contract-stale deploys its last-week sibling's store: check_seeds refuses an evaluation on that
    store's tuning seeds, and not on this week's store's (which static:contract deploys)."""
    sc = promised()
    sibling = last_week(sc)
    search.write_store(search.search_static(sibling, seeds=[7, 8], workers=1, objective="contract").to_json("test"),
                       best.cache_path(sibling, "contract"))
    search.write_store(search.search_static(sc, seeds=[5, 6], workers=1, objective="contract").to_json("test"),
                       best.cache_path(sc, "contract"))
    with pytest.raises(ValueError, match=rf"static:contract-stale's caps for '{sibling.name}' were tuned on seeds "
                                         r"7\.\.8 .* on seed 8 would test"):
        best.check_seeds(["static", "static:contract-stale"], range(8, 20), sc)
    best.check_seeds(["static:contract-stale"], [0, 1, 5, 6, 9], sc)  # this week's tuning seeds are not its own
    with pytest.raises(ValueError, match="static:contract's caps .* tuned on seeds 5..6"):
        best.check_seeds(["static:contract"], [6], sc)

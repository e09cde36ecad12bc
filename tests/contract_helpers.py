"""A bundled scenario with contracts for some of its tenants, and contracts the tests share (feasible together
on h200-live-small)."""

from __future__ import annotations

from typing import Any

from admit.envs.scenario import Scenario, load_scenario, parse_scenario

WORLDS = ("python", "compiled")

CHAT = {"requests_per_s": 1.5, "burst": 5, "attainment": 0.95}
AGENT = {"tokens_per_s": 6000, "burst": 20000, "attainment": 0.9}


def with_contracts(name: str, contracts: dict[str, dict[str, Any]], **top: Any) -> Scenario:
    """Bundled scenario ``name`` with ``contracts`` by tenant name (a tenant not named has none, whatever the
    bundled file gives it) and the top-level keys ``top`` replaced."""
    data = load_scenario(name).model_dump(exclude_none=True)
    for t in data["tenants"]:
        t.pop("contract", None)
        if t["name"] in contracts:
            t["contract"] = contracts[t["name"]]
    return parse_scenario({**data, **top}, f"{name} with contracts" if contracts else f"{name} without contracts")


def without_contracts(name: str, **top: Any) -> Scenario:
    """Bundled scenario ``name`` with no contract at all: what admit judged before tenants had them."""
    return with_contracts(name, {}, **top)


def run_in_both_worlds(sc: Scenario, policy: str, seed: int) -> dict[str, Any]:
    """One episode of ``policy`` on ``sc`` in each simulated world (envs/simulation.py, envs/compiled.py), the
    finished simulations by world: what the tests that compare the worlds read their figures from."""
    from admit.agents.registry import make_controller
    from admit.envs.compiled import make_simulation

    sims = {}
    for world in WORLDS:
        sim = make_simulation(sc, seed, world=world)
        ctrl = make_controller(policy, sc)
        ctrl.reset(sc.control_spec(), seed)
        sim.run(ctrl)
        sims[world] = sim
    return sims

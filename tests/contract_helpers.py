"""A bundled scenario with contracts for some of its tenants, and contracts the tests share (feasible together
on h200-live-small)."""

from __future__ import annotations

from typing import Any

from admit.envs.scenario import Scenario, load_scenario, parse_scenario

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

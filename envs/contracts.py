"""An episode's contract figures: which of its requests were in contract and how many of those were good.

Per tenant with a contract (core/contract.py): the requests it sent in contract (classified at arrival on
the tenant's envelope, from the episode's arrivals alone, so the same under every policy on one seed), how
many of them were good, their attainment, whether the promise was kept and the shortfall. Over the
scenario: ``contracts`` (how many tenants have one), ``contracts_met`` and ``contract_shortfall`` (summed).
Read after the run from the world's request columns, so the simulation's hot path carries nothing for it.
Requests that arrived during a warm-up (``Simulation(warmup_s=)``) are classified, as they charge the
envelope, but not counted, as the episode's other totals do not count them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from admit.core.contract import classify, figures
from admit.envs.scenario import Scenario
from admit.envs.simulation import RequestColumns


def episode_contracts(scenario: Scenario, cols: RequestColumns, warmup_s: float = 0.0
                      ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(per tenant name with a contract: its figures, overall: contracts, contracts_met, contract_shortfall);
    both empty when no tenant has a contract."""
    if not scenario.has_contracts:
        return {}, {}
    spec = scenario.control_spec()
    good = cols.good([t.request_bounds for t in spec.tenants])
    counted = cols.arrival >= warmup_s
    per: dict[str, dict[str, float]] = {}
    for k, t in enumerate(scenario.tenants):
        if t.contract is None:
            continue
        mine = np.flatnonzero(cols.tenant == k)
        inside = classify(t.contract, cols.arrival[mine], cols.prompt[mine], cols.output[mine])
        sel = mine[inside & counted[mine]]
        per[t.name] = figures(t.contract, len(sel), int(good[sel].sum()))
    overall = {
        "contracts": float(len(per)),
        "contracts_met": float(sum(f["contract_met"] for f in per.values())),
        "contract_shortfall": float(sum(f["contract_shortfall"] for f in per.values())),
    }
    return per, overall


def contract_json(scenario: Scenario) -> dict[str, Any]:
    """Each tenant's contract as given (``{name: {requests_per_s | tokens_per_s, burst, attainment}}``)."""
    return {t.name: t.contract.model_dump(exclude_none=True) for t in scenario.tenants if t.contract is not None}

"""Families that draw contracts (envs/family.py ``contracts:``), the h200-drift family, and a scenario's
last-week sibling (``last_week``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from admit.envs.family import (
    LAST_WEEK,
    FamilyError,
    contract_loads,
    instance_data,
    last_week,
    load_family,
    mean_rate,
    parse_family,
    sample_scenario,
    tenant_loads,
)
from admit.envs.scenario import load_scenario

DRIFT = [f"h200-drift@{s}" for s in range(11000, 11006)]


@pytest.mark.parametrize("name", DRIFT)
def test_drift_contracts_are_drawn_deterministically_from_the_tenants_rates_and_feasible(name: str) -> None:
    a, b = instance_data(name), instance_data(name)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    sc = load_scenario(name)
    fam = load_family("h200-drift")
    assert fam.contracts is not None
    loads = contract_loads(sc)
    assert all(x is not None and x > 0 for x in loads)
    assert sum(x for x in loads if x is not None) <= fam.contracts.max_load + 1e-9
    for t, own, cl in zip(sc.tenants, tenant_loads(sc), loads, strict=True):
        c = t.contract
        assert c is not None and c.requests_per_s is not None
        tier = next(k for k, v in fam.slo_tiers.items() if v.given() == t.slo.given())
        d = fam.contracts.draw_for(tier)
        assert d is not None and c.attainment == d.attainment
        # a fraction of the tenant's own mean rate at most its range's top (less where scaled to max_load)
        assert cl is not None and cl <= d.rate[1] * own * (1 + 1e-5)
        assert c.burst >= 1 and c.burst <= max(1.0, d.burst_s[1] * c.requests_per_s) * (1 + 1e-5)


def test_contracts_are_scaled_together_to_max_load_and_families_without_them_have_none() -> None:
    data = yaml.safe_load(Path(load_family_path("h200-mix")).read_text())
    data["contracts"] = {"max_load": 0.3, "all": {"rate": [0.9, 1.0], "burst_s": [1, 2], "attainment": 0.9}}
    fam = parse_family(data, "h200-mix with other contracts")
    plain = parse_family({k: v for k, v in data.items() if k != "contracts"}, "h200-mix without contracts")
    for seed in (11000, 11001, 11002):
        sc = sample_scenario(fam, seed)
        total = sum(x for x in contract_loads(sc) if x is not None)
        assert sum(tenant_loads(sc)) * 0.9 > 0.3  # so the contracts were scaled down ...
        assert total == pytest.approx(0.3, rel=1e-4) and total <= 0.3  # ... to max_load
        assert "scaled by" in sc.description
        bare = sample_scenario(plain, seed)  # the same instance, drawn without contracts: its tenants unchanged
        assert not bare.has_contracts
        assert [t.model_copy(update={"contract": None}) for t in sc.tenants] == list(bare.tenants)
    data["contracts"] = {"tiers": {"premium": {"rate": [0.5, 1], "burst_s": [1, 2], "attainment": 0.9}}}
    with pytest.raises(FamilyError, match="unknown tiers"):
        parse_family(data, "x")
    data["contracts"] = {"all": {"rate": [1, 0.5], "burst_s": [1, 2], "attainment": 0.9}}
    with pytest.raises(FamilyError, match="0 < low <= high"):
        parse_family(data, "x")


def load_family_path(name: str) -> str:
    from importlib import resources

    return str(resources.files("admit.envs").joinpath("families", f"{name}.yaml"))


def test_drift_instances_have_traffic_that_moves_within_the_episode() -> None:
    kinds: set[str] = set()
    moved = 0
    for s in range(11000, 11020):
        sc = load_scenario(f"h200-drift@{s}")
        for t in sc.tenants:
            kinds.add(t.arrival.kind)
            if t.arrival.kind in ("diurnal", "ramp"):
                times = t.arrival.times(np.random.default_rng(0), sc.horizon_s)
                thirds = np.histogram(times, bins=3, range=(0, sc.horizon_s))[0]
                assert thirds.max() > 1.3 * thirds.min(), (sc.name, t.name, thirds)
                moved += 1
    assert {"diurnal", "ramp", "mmpp"} <= kinds and moved >= 10
    # opposite cycles: a chat-day tenant's first half is busier than its second, a chat-night's the reverse
    for s in range(11000, 11020):
        sc = load_scenario(f"h200-drift@{s}")
        for t in sc.tenants:
            if t.arrival.kind == "diurnal":
                times = t.arrival.times(np.random.default_rng(1), sc.horizon_s)
                first = int(np.sum(times < sc.horizon_s / 2))
                assert (first > len(times) - first) == t.name.startswith("chat-day"), (sc.name, t.name)


@pytest.mark.parametrize("name", ["h200-drift@11000", "h200-drift@11003", "h200-mixed"])
def test_last_week_has_the_same_tenants_with_rates_redrawn_within_a_factor_of_two(name: str) -> None:
    sc = load_scenario(name)
    lw = last_week(sc)
    assert lw.name == name + LAST_WEEK
    assert last_week(name) == lw  # deterministic, by scenario or by name
    assert [t.name for t in lw.tenants] == [t.name for t in sc.tenants]
    assert lw.control_spec() == sc.control_spec()  # the same tenants, SLOs and contracts
    ratios = []
    for a, b in zip(lw.tenants, sc.tenants, strict=True):
        assert a.model_dump(exclude={"arrival"}) == b.model_dump(exclude={"arrival"})
        assert a.arrival.kind == b.arrival.kind
        ratios.append(mean_rate(a.arrival, sc.horizon_s) / mean_rate(b.arrival, sc.horizon_s))
    assert all(0.5 * (1 - 1e-5) <= r <= 2.0 * (1 + 1e-5) for r in ratios)
    assert any(abs(r - 1) > 0.01 for r in ratios)
    if "@" in name:
        assert load_scenario(name + LAST_WEEK) == lw  # the sibling is a scenario name of its own

"""The contract-first reward term (envs/env.py, "Rewards"): per step, the in-contract requests that end missed
(rejected, dropped, completed but not good; at the last step those still unfinished), weighted per tenant.

Over an episode its misses add up, tenant by tenant, to exactly ``contract_arrived − contract_good`` of the
episode's own contract figures (envs/contracts.py), the same in both worlds bit for bit; a scenario without
contracts gets a −0.0 term and no ``contract_misses``, so its rewards are those of the other terms alone."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from admit.envs.contracts import episode_contracts
from admit.envs.env import TenantAdmissionEnv, contract_weights
from admit.envs.family import slo_tier
from admit.envs.scenario import Scenario
from contract_helpers import AGENT, CHAT, with_contracts, without_contracts

TERMS = ("throughput", "goodput", "slo_violation", "drop", "cost", "change")


def _reward(sc: Scenario, **weights: Any) -> Scenario:
    return sc.model_copy(update={"reward": sc.reward.model_copy(update=weights)})


def _contracted(horizon_s: float = 240.0) -> Scenario:
    """h200-mixed with contracts on chat and agent (batch has none), short queues and a short queue timeout so
    that requests are rejected and dropped as well as late, and the contract-first reward with the tiers
    weighed apart."""
    sc = with_contracts("h200-mixed", {"chat": CHAT, "agent": AGENT}, horizon_s=horizon_s)
    sc = sc.model_copy(update={"admission": sc.admission.model_copy(update={"max_queue": 6, "queue_timeout_s": 2.0})})
    return _reward(sc, goodput=1.0, contract_miss=2.0, contract_tiers={"interactive": 3.0, "standard": 0.5})


def _episode(sc: Scenario, world: str, seed: int = 5) -> tuple[TenantAdmissionEnv, list[tuple[Any, ...]]]:
    """One episode under random actions that push the limits to both bounds: per step the reward, its terms and
    the info's contract misses (None where absent)."""
    env = TenantAdmissionEnv(sc, world=world)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    steps = []
    truncated = False
    while not truncated:
        _, reward, _, truncated, info = env.step(rng.integers(0, 2 * env.k + 1, size=env.n))
        steps.append((reward, dict(info["reward_terms"]), info.get("contract_misses")))
    return env, steps


@pytest.mark.parametrize("world", ["compiled", "python"])
def test_contract_misses_add_up_to_the_episodes_contract_figures(world: str) -> None:
    sc = _contracted()
    env, steps = _episode(sc, world)
    assert env.sim is not None
    per, _ = episode_contracts(sc, env.sim.request_columns())
    assert set(per) == {"chat", "agent"}
    want = sum(f["contract_arrived"] - f["contract_good"] for f in per.values())
    assert sum(s[2] for s in steps) == want > 0  # exact: counts of requests
    lost = [(t.rejected, t.dropped) for t in env.sim.totals]
    assert lost[0][0] + lost[2][0] > 0 and lost[0][1] + lost[2][1] > 0  # every way to miss happens
    # tenant by tenant: the counts behind them are the figures' own, batch (no contract) counts nothing
    totals = env.sim.contract_totals
    names = [t.name for t in sc.tenants]
    left = 0
    for k, name in enumerate(names):
        arrived, good, missed = totals[k].tolist()
        if name in per:
            assert (arrived, good) == (per[name]["contract_arrived"], per[name]["contract_good"])
            assert arrived - good - missed >= 0  # what the last step adds: still queued or running
            left += arrived - good - missed
        else:
            assert (arrived, good, missed) == (0, 0, 0)
    assert left > 0 and steps[-1][2] >= left  # the last step counts the unfinished ones
    # weighted by tier: chat is interactive (3), agent standard (0.5), each miss times contract_miss (2)
    c = contract_weights(sc)
    assert [slo_tier(t.slo.model_dump(exclude_none=True)) for t in sc.tenants] == ["interactive", "batch", "standard"]
    assert c.tolist() == [3.0, 0.0, 0.5]
    weighted = sum(c[names.index(n)] * (f["contract_arrived"] - f["contract_good"]) for n, f in per.items())
    got = -sum(s[1]["contract_miss"] for s in steps) * sc.interval_s / 2.0
    assert got == pytest.approx(weighted, rel=1e-12)
    assert all(s[0] == pytest.approx(sum(s[1].values()), abs=1e-9) for s in steps)


def test_both_worlds_give_the_same_contract_rewards_bit_for_bit() -> None:
    sc = _contracted(horizon_s=180.0)
    _, compiled = _episode(sc, "compiled", seed=2)
    _, python = _episode(sc, "python", seed=2)
    assert compiled == python
    assert any(s[1]["contract_miss"] < 0 for s in compiled)


@pytest.mark.parametrize("world", ["compiled", "python"])
def test_without_contracts_the_term_is_minus_zero_and_nothing_else_changes(world: str) -> None:
    sc = _reward(without_contracts("h200-mixed", horizon_s=120.0), goodput=1.0, contract_miss=5.0)
    assert not sc.has_contracts and contract_weights(sc).tolist() == [0.0] * len(sc.tenants)
    env, steps = _episode(sc, world)
    assert env.sim is not None
    for reward, terms, misses in steps:
        assert misses is None
        assert terms["contract_miss"] == 0.0 and math.copysign(1.0, terms["contract_miss"]) == -1.0
        # adding −0.0 leaves a float sum as it was: the reward is the other terms' sum, bit for bit
        assert reward == float(sum(terms[t] for t in TERMS))
    assert env.sim.contract_totals.tolist() == [[0, 0, 0]] * len(sc.tenants)


def test_contract_weights_follow_tiers_and_tenant_weights() -> None:
    sc = _contracted()
    assert contract_weights(_reward(sc, contract_tiers={})).tolist() == [1.0, 0.0, 1.0]  # every tier 1 by default
    data = sc.model_dump(exclude_none=True)
    data["tenants"][2]["weight"] = 4.0
    heavy = Scenario.model_validate(data)
    assert contract_weights(heavy).tolist() == [3.0, 0.0, 0.5]  # tenant weights only under tenant_weights
    assert contract_weights(_reward(heavy, tenant_weights=True)).tolist() == [3.0, 0.0, 2.0]

"""The contract controller (controllers/contract.py): guarantees first, idle contracted capacity lent, reclaim
from borrowers and never from owners below their guarantee, nothing grows under saturation; and a short
episode on a scenario with contracts."""

import math

import pytest
from admit.agents.registry import make_controller
from admit.controllers.contract import ContractController
from admit.core.contract import Contract
from admit.core.controller import validate_deltas
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec, Limits, TenantSpec
from admit.envs.compiled import make_simulation
from contract_helpers import AGENT, CHAT, with_contracts

LIMITS = Limits(min=1, max=64, initial=25, max_step=4)  # C = 75 for three tenants
RPS = Contract(requests_per_s=2.0, burst=5, attainment=0.9)


def tenant(name: str, load: float | None = None, ttft: float = 1.0) -> TenantSpec:
    """A tenant with a TTFT objective (impatient: Little's guarantee) unless ``ttft`` is inf (patient)."""
    return TenantSpec(name, contract=RPS if load is not None else None, contract_load=load, slo_ttft_s=ttft)


# a and c have contracts (nominal 30 each of C = 75), b has none (its guarantee is limits.min)
THREE = ControlSpec(tenants=(tenant("a", 0.4), tenant("b"), tenant("c", 0.4)), limits=LIMITS, interval_s=2.0,
                    window_s=4.0)
TWO = ControlSpec(tenants=(tenant("a", 0.4), tenant("b")), limits=LIMITS, interval_s=2.0, window_s=4.0)


def t(limit: float, in_flight: float = 0.0, queue: float = 0.0, **kw: float) -> TenantObservation:
    return TenantObservation(queue_depth=queue, in_flight=in_flight, limit=limit, **kw)


def obs(tenants: list[TenantObservation], kv: float = 0.3, waiting: float = 0.0) -> Observation:
    return Observation(10.0, 4.0, kv, 10.0, waiting, tenants)


def controller(spec: ControlSpec, **kw: object) -> ContractController:
    c = ContractController(**kw)  # type: ignore[arg-type]
    c.reset(spec, 0)
    return c


@pytest.mark.parametrize("guarantee", ["share", "little"])
def test_reclaim_cuts_borrowers_and_never_owners_below_their_guarantee(guarantee: str) -> None:
    c = controller(THREE, guarantee="share")
    assert c.nominal == [30, 15, 30]
    # a's in-contract demand returned (a queue below its guarantee); c is an owner below its guarantee with
    # no queue; b borrows 39 above its guarantee
    c = controller(THREE, guarantee=guarantee)
    # a and c hold a slot 20 s (10 in flight, 2 completions in 4 s): Little's guarantee is over 40
    out = c.act(obs([t(10, 10, 5, arrivals=8, completions=2), t(40, 40, 10, arrivals=40, completions=40),
                     t(20, 20, 0, arrivals=8, completions=4)]))
    assert c.g[0] > 10 and c.g[2] > 20 and c.g[1] == LIMITS.min
    assert out[1] == -LIMITS.max_step  # the borrower pays, at most max_step
    assert out[0] == LIMITS.max_step and out[2] >= 0  # owners below their guarantee walk up, never down
    assert validate_deltas(out, THREE)


@pytest.mark.parametrize("guarantee", ["share", "little"])
def test_an_idle_owners_guarantee_is_lent_to_a_backlogged_tenant(guarantee: str) -> None:
    c = controller(TWO, guarantee=guarantee)
    idle = t(1)  # a: a contract and no demand at all (its limit may wait at its guarantee: unused, it costs nothing)
    out = c.act(obs([idle, t(10, 10, 20, arrivals=30, tokens_in_flight=10_000)]))
    assert out[1] > 0  # b, with no contract, borrows
    # its share of the KV cache is not held for it: b grows by as much as with no contract at all
    free = ControlSpec(tenants=(tenant("a"), tenant("b")), limits=LIMITS, interval_s=2.0, window_s=4.0)
    assert controller(free, guarantee=guarantee).act(obs([idle, t(10, 10, 20, arrivals=30,
                                                                  tokens_in_flight=10_000)]))[1] == out[1]
    # the same with a's demand back: a walks to its guarantee and the loan to b is reclaimed
    c = controller(TWO, guarantee="share")
    out = c.act(obs([t(1, 1, 6, arrivals=8), t(40, 40, 20, arrivals=30, tokens_in_flight=10_000)]))
    assert out[0] > 0 and out[1] < 0


def test_growth_stops_under_saturation_and_the_largest_borrower_pays() -> None:
    c = controller(TWO)
    busy = [t(1), t(10, 10, 20, arrivals=30, tokens_in_flight=10_000)]
    out = c.act(obs(busy, waiting=10.0))  # the saturation gate's score is 2
    assert all(d <= 0 for d in out) and out[1] < 0
    c = controller(TWO)
    out = c.act(obs(busy, kv=0.9))  # KV usage past 0.8 saturates too
    assert all(d <= 0 for d in out)


def test_the_little_guarantee_is_the_in_contract_load_times_the_hold_time_with_headroom() -> None:
    c = controller(TWO, headroom=1.25)  # guarantee="little" is the default; a has a TTFT objective
    # a sends 4 req/s (2 in contract); 6 in flight, 8 completions in the 4 s window: a request holds 3 s
    c.act(obs([t(6, 6, 0, arrivals=16, completions=8), t(1)]))
    m = 2.0 * 3.0
    assert c.g[0] == math.ceil(1.25 * m + 2.0 * math.sqrt(m))
    assert c.g[1] == LIMITS.min


def test_with_a_tpot_objective_the_hold_time_is_taken_at_the_target_step_not_the_contended_one() -> None:
    """A contended engine (a 90 ms step, requests held 30 s) does not inflate the guarantee: the hold time is
    the tenant's output tokens at step_frac × the tightest TPOT objective, plus prefill_s; the same tenant
    without a TPOT objective keeps the measured one. (Its TPOT, under the objective, leaves b_i at 1.)"""
    wide = Limits(min=1, max=512, initial=25, max_step=4)
    a = TenantSpec("a", contract=RPS, contract_load=0.4, slo_ttft_s=1.0, slo_tpot_s=0.1)
    spec = ControlSpec(tenants=(a, tenant("b")), limits=wide, interval_s=2.0, window_s=4.0)
    # 30 in flight, 4 completions in 4 s (a request holds 30 s), 300 output tokens each (300 tokens/s)
    contended = [t(30, 30, 0, arrivals=16, completions=4, output_tokens_per_s=300.0, tpot_p50=0.09,
                   tpot_p99=0.095, samples=4), t(1)]
    c = controller(spec, headroom=1.25)
    c.act(obs(contended))
    hold = 300 * 0.6 * 0.1 + 0.5
    assert c.hold_s(0) == pytest.approx(hold)
    m = 2.0 * hold
    assert c.g[0] == math.ceil(1.25 * m + 2.0 * math.sqrt(m))
    no_tpot = ControlSpec(tenants=(tenant("a", 0.4), tenant("b")), limits=wide, interval_s=2.0, window_s=4.0)
    measured = controller(no_tpot, headroom=1.25)  # no TPOT objective: Little's law on what it measured
    measured.act(obs(contended))
    assert measured.hold_s(0) == pytest.approx(30.0)
    assert measured.g[0] == math.ceil(1.25 * 60.0 + 2.0 * math.sqrt(60.0)) > c.g[0]


def test_a_patient_owners_guarantee_follows_its_good_completions() -> None:
    """Without a TTFT objective the guarantee grows by one while its good completions fall short of its
    in-contract rate and it uses its guarantee, at most once a window, and not while the engine is saturated."""
    patient = ControlSpec(tenants=(tenant("a", 0.4, ttft=math.inf), tenant("b")), limits=LIMITS, interval_s=2.0,
                          window_s=4.0)
    c = controller(patient)
    busy = [t(1, 1, 5, arrivals=8, goodput=0.5), t(1)]
    c.act(obs(busy))
    assert c.g[0] == LIMITS.min + 1
    c.act(obs(busy))  # the same window: no second step
    assert c.g[0] == LIMITS.min + 1
    c.act(Observation(20.0, 4.0, 0.3, 10.0, 20.0, [t(2, 2, 5, arrivals=8, goodput=0.5), t(1)]))  # saturated
    assert c.g[0] == LIMITS.min + 1
    c.act(Observation(30.0, 4.0, 0.3, 10.0, 0.0, [t(2, 2, 5, arrivals=8, goodput=0.5), t(1)]))
    assert c.g[0] == LIMITS.min + 2
    c.act(Observation(40.0, 4.0, 0.3, 10.0, 0.0, [t(3, 3, 0, arrivals=8, goodput=5.0), t(1)]))  # plenty: back down
    assert c.g[0] == LIMITS.min + 1


def test_unknown_guarantee_is_refused() -> None:
    with pytest.raises(ValueError, match="guarantee must be one of"):
        ContractController(guarantee="best")


class Recording:
    def __init__(self, inner: object) -> None:
        self.inner, self.name = inner, "rec"
        self.seen: list[list[float]] = []

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        self.inner.reset(spec, seed)  # type: ignore[attr-defined]

    def act(self, o: Observation) -> list[int]:
        self.seen.append([x.limit for x in o.tenants])
        return self.inner.act(o)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["contract", "contract-share"])
def test_short_episode_with_contracts_keeps_limits_within_bounds(name: str) -> None:
    sc = with_contracts("h200-live-small", {"chat": CHAT, "agent": AGENT}, horizon_s=60)
    s = sc.control_spec()
    ctrl = Recording(make_controller("contract", sc) if name == "contract" else ContractController("share"))
    ctrl.reset(s, 3)
    sim = make_simulation(sc, 3, world="python")  # the Python world validates every decision's deltas
    sim.run(ctrl)
    assert len(ctrl.seen) > 5 and sum(tot.good for tot in sim.totals) > 0
    assert all(s.limits.min <= x <= s.limits.max for row in ctrl.seen for x in row)

"""Baselines that honour contracts (controllers/contracts_field.py): each rule's defining behaviour on
constructed Observations, and a short episode of each on a scenario with contracts."""

import math

import pytest
from admit.agents.registry import make_controller
from admit.controllers.contracts_field import (
    ApfController,
    KueueBorrowController,
    LitellmReservedController,
    ShareStaticController,
    VtcController,
    allocate,
    contract_shares,
    nominal_caps,
    total_concurrency,
)
from admit.core.contract import Contract
from admit.core.controller import validate_deltas
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec, Limits, TenantSpec
from admit.envs.compiled import make_simulation
from contract_helpers import AGENT, CHAT, with_contracts

CONTRACT_BASELINES = ("static:share", "apf", "kueue-borrow", "litellm-reserved", "vtc")
LIMITS = Limits(min=1, max=64, initial=25, max_step=64)  # C = 100 for four tenants; one decision reaches a target
RPS = Contract(requests_per_s=2.0, burst=5, attainment=0.9)


def tenant(name: str, load: float | None = None, **kw: object) -> TenantSpec:
    return TenantSpec(name, contract=RPS if load is not None else None, contract_load=load, **kw)  # type: ignore[arg-type]


def spec(*tenants: TenantSpec, limits: Limits = LIMITS) -> ControlSpec:
    return ControlSpec(tenants=tenants, limits=limits, interval_s=2.0, window_s=4.0)


def obs(tenants: list[TenantObservation], kv: float = 0.0, waiting: float = 0.0, time_s: float = 0.0) -> Observation:
    return Observation(time_s, 4.0, kv, 10.0, waiting, tenants)


def t(limit: float, in_flight: float = 0.0, queue: float = 0.0, **kw: float) -> TenantObservation:
    return TenantObservation(queue_depth=queue, in_flight=in_flight, limit=limit, **kw)


FOUR = spec(tenant("a", 0.4), tenant("b", 0.2), tenant("c", 0.1), tenant("d"))


# ---------------------------------------------------------------------------------------- shares and static:share
def test_shares_are_the_contract_loads_and_the_rest_goes_to_tenants_without_one():
    shares, basis = contract_shares(FOUR)
    assert basis == "capacity" and shares == pytest.approx([0.4, 0.2, 0.1, 0.3])
    assert total_concurrency(FOUR) == 100
    assert nominal_caps(FOUR, shares) == [40, 20, 10, 30]


def test_live_without_loads_shares_follow_the_contracted_requests_per_second():
    tokens = Contract(tokens_per_s=4000.0, burst=1000, attainment=0.9)  # 4 req/s at 1000 tokens a request
    s = spec(TenantSpec("a", contract=RPS), TenantSpec("b", contract=tokens), TenantSpec("c"))
    shares, basis = contract_shares(s)
    assert basis == "requests" and shares == pytest.approx([1 / 3, 2 / 3, 0.0])
    assert nominal_caps(s, shares) == [25, 50, LIMITS.min]  # C = 75


def test_static_share_caps_are_proportional_to_the_contracts():
    c = ShareStaticController()
    c.reset(FOUR, 0)
    assert c.act(obs([t(25), t(25), t(25), t(25)])) == [15, -5, -15, 5]
    assert c.decision_rule() == ("static", (40.0, 20.0, 10.0, 30.0))  # the compiled world runs it as static
    # every tenant contracted, loads under 1: C is divided in proportion; a small share is still limits.min
    c.reset(spec(tenant("a", 0.1), tenant("b", 0.4)), 0)
    assert c.cap == [10, 40]  # C = 50 divided 1 : 4
    c.reset(spec(tenant("a", 0.001), tenant("b", 0.5)), 0)
    assert c.cap == [LIMITS.min, 50]
    # without contracts it is static at the initial caps
    c.reset(spec(tenant("a"), tenant("b")), 0)
    assert c.cap == [LIMITS.initial, LIMITS.initial]


# ---------------------------------------------------------------------------------------- APF
def test_allocate_shares_out_by_one_proportion_within_bounds():
    got = allocate(100.0, [10, 10, 10], [100, 100, 15], [50, 30, 40])
    assert sum(got) == pytest.approx(100.0) and got[2] == pytest.approx(15.0)
    assert got[0] / got[1] == pytest.approx(50 / 30)
    assert allocate(10.0, [5, 6], [9, 9], [5, 6]) == [5, 6]  # the lower bounds reach it already


def apf_at(c: ApfController, demands: list[float], t0: float) -> list[int]:
    """Decisions every 2 s through one 10 s period at these demands; the deltas of the last one."""
    out: list[int] = []
    for k in range(5):
        out = c.act(obs([t(0, in_flight=d) for d in demands], time_s=t0 + 2.0 * (k + 1)))
    return out


def test_apf_nominal_lendable_and_borrowing_follow_kubernetes():
    c = ApfController()
    c.reset(spec(tenant("a", 0.5), tenant("b", 0.3), tenant("c", 0.2), limits=Limits(1, 64, 10, 64)), 0)
    assert c.nominal == [15, 9, 6]  # ceil(30 · NCS / Σ NCS)
    assert c.min_cl == [7, 4, 3] and c.max_cl == [45, 39, 36]  # lendable 50 %: round(NominalCL / 2)
    assert c.current == [11, 7, 5]  # NominalCL − ⌊LendableCL / 2⌋ before the first adjustment


def test_apf_idle_level_lends_its_seats_and_gets_its_nominal_back_when_demand_returns():
    c = ApfController()
    s = spec(tenant("a", 0.5), tenant("b", 0.5), limits=Limits(1, 64, 10, 64))
    c.reset(s, 0)
    assert c.nominal == [10, 10] and c.min_cl == [5, 5]
    apf_at(c, [0, 30], 0.0)  # a idle, b wants 30
    assert c.current == [5, 15]  # a keeps its minCL; its 5 lendable seats are b's
    apf_at(c, [12, 30], 10.0)  # a's demand is back: its watermark lifts its bound to its nominal
    assert c.current[0] >= 10 and sum(c.current) == 20
    # nothing moves between adjustments
    before = list(c.current)
    c.act(obs([t(0, in_flight=0), t(0, in_flight=0)], time_s=21.0))
    assert c.current == before


def test_apf_borrowing_limit_bounds_the_borrower():
    c = ApfController(borrowing_limit_percent=20)
    c.reset(spec(tenant("a", 0.5), tenant("b", 0.5), limits=Limits(1, 64, 10, 64)), 0)
    apf_at(c, [0, 30], 0.0)
    assert c.current[1] == 12  # NominalCL 10 + round(10 · 20 %)


# ---------------------------------------------------------------------------------------- Kueue
KUEUE = spec(tenant("a", 0.5), tenant("b", 0.5), limits=Limits(1, 64, 10, 4))  # nominal 10 each, max_step 4


def kueue() -> KueueBorrowController:
    c = KueueBorrowController()
    c.reset(KUEUE, 0)
    assert c.nominal == [10, 10]
    return c


def test_kueue_lends_idle_nominal_quota_to_a_queue():
    c = kueue()
    assert c.act(obs([t(10, in_flight=2), t(10, in_flight=10, queue=20)])) == [0, 4]  # 8 idle in a's quota
    assert c.act(obs([t(10, in_flight=2), t(16, in_flight=16, queue=20)])) == [0, 2]  # 2 idle left
    assert c.act(obs([t(10, in_flight=2), t(18, in_flight=18, queue=20)])) == [0, 0]  # all lent


def test_kueue_reclaim_cuts_borrowers_not_owners_never_below_nominal():
    c = kueue()
    # a's demand is back (12 > its nominal): b borrowed 8 that are no longer idle; b is cut, a is not
    d = c.act(obs([t(10, in_flight=10, queue=2), t(18, in_flight=18, queue=20)]))
    assert d == [0, -4]
    d = c.act(obs([t(10, in_flight=10, queue=2), t(11, in_flight=11, queue=20)]))
    assert d == [0, -1]  # down to its nominal, not below
    assert c.act(obs([t(10, in_flight=10, queue=2), t(10, in_flight=10, queue=20)])) == [0, 0]


def test_kueue_returns_unused_loans_and_walks_to_nominal():
    c = kueue()
    assert c.act(obs([t(4), t(18, in_flight=12)])) == [4, -4]  # a up to its quota; b's loan unused, returned
    assert c.act(obs([t(8), t(14, in_flight=12)])) == [2, -2]


# ---------------------------------------------------------------------------------------- LiteLLM
def test_litellm_idle_capacity_for_anyone_below_saturation_reserved_shares_past_it():
    c = LitellmReservedController()
    s = spec(tenant("a", 0.3), tenant("b", 0.1), limits=Limits(1, 64, 20, 8))  # C = 40 divided 3 : 1
    c.reset(s, 0)
    assert c.reserved == [30, 10]
    assert c.act(obs([t(20, 20, queue=5), t(20, 3)], kv=0.5)) == [8, 0]  # not saturated: a queue grows
    assert c.act(obs([t(20, 20, queue=5), t(20, 20, queue=5)], kv=0.9)) == [8, -8]  # saturated (0.9/0.8 ≥ 1)
    assert c.act(obs([t(28, 20), t(12, 12)], waiting=5)) == [2, -2]  # the engine's queue saturates it too


# ---------------------------------------------------------------------------------------- VTC
def test_vtc_grows_the_least_served_backlogged_and_cuts_the_most_served_when_saturated():
    c = VtcController()
    s = spec(TenantSpec("a"), TenantSpec("b"), TenantSpec("c"), limits=Limits(1, 64, 10, 2))
    c.reset(s, 0)
    # a was served 2× b's output tokens, c nothing; all backlogged
    served = [t(10, 10, queue=5, completions=4, output_tokens_per_s=200.0, prompt_tokens_queued=500),
              t(10, 10, queue=5, completions=4, output_tokens_per_s=100.0, prompt_tokens_queued=500),
              t(10, 10, queue=5, prompt_tokens_queued=500)]
    assert c.act(obs(served, time_s=2.0)) == [0, 0, 2]  # not saturated: the least served grows
    assert c.counter[0] == pytest.approx(2.0 * (4 / 4.0 * 100 + 2 * 200.0))  # input 1, output 2, over 2 s
    assert c.act(obs(served, kv=0.95, time_s=4.0)) == [-2, 0, 2]  # saturated: the most served gives it up


def test_vtc_weights_divide_the_service_and_the_counter_lift_banks_no_idle_credit():
    c = VtcController()
    s = spec(TenantSpec("a", weight=4.0), TenantSpec("b"), limits=Limits(1, 64, 10, 2))
    c.reset(s, 0)
    same = t(10, 10, queue=5, completions=0, output_tokens_per_s=100.0)
    assert c.act(obs([same, same], time_s=2.0)) == [2, 0]  # same tokens, a's weight 4: a is less served
    # b idle for a long time while a is served; when b queues again it starts at a's counter, not at 0
    c2 = VtcController()
    c2.reset(s, 0)
    for k in range(10):
        c2.act(obs([t(10, 10, queue=5, output_tokens_per_s=400.0), t(10, 0)], time_s=2.0 * (k + 1)))
    a_counter = c2.counter[0]
    c2.act(obs([t(10, 10, queue=5), t(10, 0, queue=3)], time_s=22.0))
    assert c2.counter[1] == pytest.approx(a_counter)


# ---------------------------------------------------------------------------------------- registry and episodes
@pytest.mark.parametrize("name", CONTRACT_BASELINES)
def test_registry_builds_each(name: str):
    assert make_controller(name).name == name


class Recording:
    """Wraps a controller and records the limits it saw at each decision."""

    def __init__(self, inner: object) -> None:
        self.inner, self.name = inner, getattr(inner, "name", "?")
        self.seen: list[list[float]] = []

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.inner.reset(spec, seed)  # type: ignore[attr-defined]

    def act(self, o: Observation) -> list[int]:
        self.seen.append([x.limit for x in o.tenants])
        return self.inner.act(o)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", CONTRACT_BASELINES)
def test_short_episode_with_contracts_keeps_limits_within_bounds(name: str):
    sc = with_contracts("h200-live-small", {"chat": CHAT, "agent": AGENT}, horizon_s=60)
    s = sc.control_spec()
    assert any(x.contract_load for x in s.tenants)
    ctrl = Recording(make_controller(name, sc))
    ctrl.reset(s, 3)
    sim = make_simulation(sc, 3, world="python")  # the Python world validates every decision's deltas
    sim.run(ctrl)
    assert len(ctrl.seen) > 5 and sum(tot.good for tot in sim.totals) > 0
    lo, hi = s.limits.min, s.limits.max
    assert all(lo <= x <= hi for row in ctrl.seen for x in row)
    # and one saturated decision by hand on the scenario's own spec
    c = make_controller(name, sc)
    c.reset(s, 0)
    busy = [TenantObservation(queue_depth=50, in_flight=16, limit=16, completions=3, output_tokens_per_s=50,
                              prompt_tokens_queued=40_000, tokens_in_flight=20_000) for _ in range(s.n_tenants)]
    assert validate_deltas(c.act(Observation(10.0, s.window_s, 0.99, 16, 20, busy)), s)
    assert math.isfinite(sum(ctrl.seen[-1]))

"""The field's shipped baselines (controllers/field.py): each rule's behaviour, and whole episodes."""

import math

import pytest
from admit.agents.registry import make_controller
from admit.controllers.field import (
    DynamoWdrrController,
    LlmdShedController,
    LlmdSoftController,
    VllmTokenCapController,
)
from admit.core.controller import validate_deltas
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec, Limits, TenantSpec
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import run_policy

FIELD = ("llmd-shed", "llmd-soft", "vllm-tokencap", "dynamo-wdrr")
# a wide step so that one decision reaches its target
LIMITS = Limits(min=1, max=64, initial=32, max_step=64)


def spec(*tenants: TenantSpec) -> ControlSpec:
    return ControlSpec(tenants=tenants, limits=LIMITS, interval_s=2.0, window_s=10.0)


def obs(tenants: list[TenantObservation], kv: float = 0.0, waiting: float = 0.0, time_s: float = 0.0,
        prefill: float | None = None) -> Observation:
    p = sum(t.prefill_tokens for t in tenants) if prefill is None else prefill
    return Observation(time_s, 10.0, kv, 10.0, waiting, tenants, prefill_tokens_waiting=p)


def busy(limit: float = 32, in_flight: float = 30, queue: float = 20, **kw: float) -> TenantObservation:
    return TenantObservation(queue_depth=queue, in_flight=in_flight, limit=limit, **kw)


def test_shed_cuts_the_low_priority_tenant_only_when_saturated():
    c = LlmdShedController()
    c.reset(spec(TenantSpec("critical", priority=1), TenantSpec("batch", priority=0)), seed=0)
    assert c.p_shed(obs([busy(), busy()], waiting=10)) == 1.0  # sat = 2
    saturated = c.act(obs([busy(), busy()], waiting=10))
    assert saturated == [0, LIMITS.min - 32]  # p_shed = 1: every demanded request shed, down to limits.min
    assert c.act(obs([busy(), busy()])) == [0, 0]  # idle engine: p_shed = 0, both at the operator cap
    # in between (sat = 0.25: p_shed ≈ 0.29) the cut is partial and still only the sheddable tenant's
    # (demand 30, so about 21 kept); a demand whose kept share is still over the cap is not cut
    mid = c.act(obs([busy(queue=0), busy(queue=0)], kv=0.2))
    assert mid[0] == 0 and -31 < mid[1] < 0
    assert c.act(obs([busy(), busy(in_flight=30, queue=34)], kv=0.2)) == [0, 0]


def test_shed_with_one_priority_is_static():
    c = LlmdShedController()
    c.reset(spec(TenantSpec("a"), TenantSpec("b")), seed=0)
    assert c.act(obs([busy(), busy()], waiting=50, kv=1.0)) == [0, 0]


def test_shed_is_reproducible_per_seed():
    def run(seed: int) -> list[list[int]]:
        c = LlmdShedController()
        c.reset(spec(TenantSpec("hi", priority=1), TenantSpec("lo", priority=0)), seed=seed)
        return [c.act(obs([busy(), busy(in_flight=40, queue=20)], kv=0.21)) for _ in range(20)]

    assert run(3) == run(3)


def test_soft_ceiling_gates_lower_bands_first_and_never_the_top():
    c = LlmdSoftController()
    c.reset(spec(TenantSpec("top", priority=2), TenantSpec("mid", priority=1), TenantSpec("low", priority=0)))
    f = [[c.dispatch_fraction(rank, sat) for rank in range(3)] for sat in (0.3, 0.65, 0.8, 1.2)]
    assert f[0] == [1.0, 1.0, 1.0]  # below every ceiling
    assert f[1] == [1.0, 1.0, 0.5]  # 0.65 > 1 - 2·0.65/2 only for the lowest band; k = round(0.65/0.35) = 2
    assert f[2] == [1.0, 0.25, 0.25]  # both lower bands past; k = round(0.8/0.2) = 4
    assert f[3] == [1.0, 0.0, 0.0]  # saturated: gated bands get nothing
    t = [busy(in_flight=30, queue=10) for _ in range(3)]  # demand 40
    assert c.act(obs(t, kv=0.52)) == [0, 0, 20 - 32]  # sat 0.65: lowest band gets round(40/2)
    assert c.act(obs(t, kv=0.64)) == [0, 10 - 32, 10 - 32]  # sat 0.8: round(40/4)
    assert c.act(obs(t)) == [0, 0, 0]


def test_soft_with_one_band_never_gates():
    c = LlmdSoftController()
    c.reset(spec(TenantSpec("a"), TenantSpec("b")))
    assert c.act(obs([busy(), busy()], waiting=50, kv=1.0)) == [0, 0]


def tokencap(thr: float) -> VllmTokenCapController:
    c = VllmTokenCapController()
    c.reset(spec(TenantSpec("chat", slo_ttft_s=0.5), TenantSpec("long", slo_ttft_s=2.0)))
    c.thr = thr
    return c


def test_token_cap_is_the_tightest_ttft_times_throughput():
    assert tokencap(10_000).cap() == 5_000  # chat's 0.5 s × 10k tokens/s
    c = VllmTokenCapController(default_ttft_s=1.5)
    c.reset(spec(TenantSpec("a"), TenantSpec("b")))
    assert c.cap() == math.inf  # no estimate yet: no cap, and the limits hold
    assert c.act(obs([busy(prefill_tokens=1e6), busy()])) == [0, 0]
    c.thr = 2_000
    assert c.cap() == 3_000  # no TTFT objective: the default target


def test_token_cap_lowers_limits_over_the_cap_and_raises_them_under():
    c = tokencap(10_000)  # cap 5,000 prompt tokens in prefill
    heavy = [busy(limit=32, in_flight=30, queue=5, prefill_tokens=8_000, prompt_tokens_queued=5_000, arrivals=5),
             busy(limit=32, in_flight=30, queue=5, prefill_tokens=12_000, prompt_tokens_queued=5_000, arrivals=5)]
    over = c.act(obs(heavy, time_s=0.0))
    assert all(d < 0 for d in over)  # 20k > 5k: both give back 3/4 of their prefill requests
    light = [busy(limit=10, in_flight=10, queue=5, prefill_tokens=0, prompt_tokens_queued=1_000, arrivals=5),
             busy(limit=10, in_flight=10, queue=5, prefill_tokens=500, prompt_tokens_queued=1_000, arrivals=5)]
    under = c.act(obs(light, time_s=2.0))
    assert all(d > 0 for d in under)  # room for the queues and the expected arrivals


def test_token_cap_has_no_fairness_the_same_fraction_for_everyone():
    c = tokencap(10_000)
    # both tenants hold the same share of their requests in prefill: both lose the same number
    t = [busy(limit=32, in_flight=20, queue=0, prefill_tokens=10_000, tokens_in_flight=20_000) for _ in range(2)]
    d = c.act(obs(t))
    assert d[0] == d[1] < 0


def test_token_cap_estimates_prefill_throughput_from_the_drain():
    c = VllmTokenCapController()
    c.reset(spec(TenantSpec("a", slo_ttft_s=1.0)))
    a0 = TenantObservation(in_flight=4, limit=32, prefill_tokens=20_000, tokens_in_flight=20_000)
    a1 = TenantObservation(in_flight=4, limit=32, prefill_tokens=10_000, tokens_in_flight=20_400)
    c.act(obs([a0], time_s=0.0))
    c.act(obs([a1], time_s=2.0))  # no admission, no completion: 10k tokens left prefill in 2 s
    assert c.thr == pytest.approx(5_000)
    assert c.cap() == pytest.approx(5_000)
    c.act(obs([TenantObservation(in_flight=4, limit=32, tokens_in_flight=20_800)], time_s=4.0))
    assert c.thr == pytest.approx(5_000)  # prefill ran dry: not a capacity sample


def test_wdrr_shares_the_budget_in_proportion_to_weight():
    c = DynamoWdrrController()
    c.reset(spec(TenantSpec("gold", weight=2.0), TenantSpec("bronze", weight=1.0)))
    assert c.allocate(30, [100, 100], [500.0, 500.0], [0, 1]) == [20, 10]
    # token-cost quanta: a tenant whose requests cost twice as much gets half the slots per weight
    assert c.allocate(30, [100, 100], [1000.0, 500.0], [0, 1]) == [15, 15]
    # demand caps a share; the rest of the budget goes to whoever still wants it, then to headroom by weight
    assert c.allocate(30, [4, 100], [500.0, 500.0], [0, 1]) == [4, 26]
    assert c.allocate(30, [3, 3], [500.0, 500.0], [0, 1]) == [3 + 16, 3 + 8]


def test_wdrr_most_urgent_first_and_budget_follows_the_engine():
    c = DynamoWdrrController()
    c.reset(spec(TenantSpec("a", slo_ttft_s=0.5), TenantSpec("b", slo_ttft_s=5.0)))
    # equal weights, equal costs, an odd budget: the extra slot goes to the class visited first
    assert c.allocate(5, [10, 10], [100.0, 100.0], [1, 0]) == [2, 3]
    late = TenantObservation(queue_depth=5, in_flight=20, limit=32, queue_wait_p99=0.4, slo_ttft=0.5,
                             prompt_tokens_queued=500)
    early = TenantObservation(queue_depth=5, in_flight=20, limit=32, queue_wait_p99=0.1, slo_ttft=5.0,
                              prompt_tokens_queued=500)
    assert c.slack(late) < c.slack(early)
    start = c.budget
    c.act(obs([late, early], waiting=4))  # the engine queues: the budget shrinks below what is in flight
    assert c.budget == pytest.approx(0.9 * min(start, 40))
    d = c.act(obs([late, early], waiting=4))
    assert all(x < 0 for x in d)
    before = c.budget
    c.act(obs([late, early]))  # headroom and backlog: it grows
    assert c.budget == before + LIMITS.max_step


@pytest.mark.parametrize("name", FIELD)
def test_registry_builds_each(name: str):
    c = make_controller(name)
    assert c.name == name
    with pytest.raises(ValueError, match="takes no argument"):
        make_controller(f"{name}:1")


@pytest.mark.parametrize("name", FIELD)
def test_whole_episode_on_long_context_chat(name: str):
    sc = load_scenario("long-context-chat", horizon_s=60)
    r = run_policy(sc, name, 1)  # Simulation validates every decision's deltas (validate_deltas)
    assert r["arrived"] > 0 and r["completed"] > 0
    assert 0.0 <= r["worst_attainment"] <= 1.0 and r["goodput_rps"] >= 0.0
    # and one decision by hand, on the scenario's own spec
    c = make_controller(name)
    s = sc.control_spec()
    c.reset(s, 0)
    t = [TenantObservation(queue_depth=50, in_flight=64, limit=64, prefill_tokens=40_000,
                           prompt_tokens_queued=400_000, tokens_in_flight=90_000) for _ in range(s.n_tenants)]
    assert validate_deltas(c.act(obs(t, kv=0.95, waiting=20)), s)

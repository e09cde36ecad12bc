"""The token-aware controller (controllers/ledger.py): its ledgers, its donor, its quotas, whole episodes."""

import math

import pytest
from admit.agents.registry import make_controller
from admit.controllers.around import AroundBase
from admit.controllers.ledger import LedgerController
from admit.core.controller import validate_deltas
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec, Limits, TenantSpec
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import run_policy

LIMITS = Limits(min=1, max=256, initial=32, max_step=8)
CHAT = TenantSpec("chat", slo_ttft_s=0.5, slo_tpot_s=0.05)
BATCH = TenantSpec("batch", slo_e2e_s=120.0)


def spec(*tenants: TenantSpec) -> ControlSpec:
    return ControlSpec(tenants=tenants, limits=LIMITS, interval_s=2.0, window_s=10.0, queue_timeout_s=30.0)


def obs(tenants: list[TenantObservation], time_s: float, kv: float = 0.3, waiting: float = 0.0) -> Observation:
    return Observation(time_s, 10.0, kv, 20.0, waiting, tenants,
                       prefill_tokens_waiting=sum(t.prefill_tokens for t in tenants))


def chat(slow: bool, **kw: float) -> TenantObservation:
    """The chat tenant's window: 50 completions, TTFT p99 far over its 0.5 s objective when ``slow``."""
    ttft = (0.9, 2.0, 3.0) if slow else (0.05, 0.1, 0.15)
    base = dict(in_flight=10, limit=32, completions=50, samples=50, ttft_p50=ttft[0], ttft_p95=ttft[1],
                ttft_p99=ttft[2], tpot_p50=0.01, tpot_p99=0.02, tokens_in_flight=10_000, output_tokens_per_s=50)
    return TenantObservation(**{**base, **kw})


def batch(**kw: float) -> TenantObservation:
    base = dict(in_flight=20, limit=32, completions=2, samples=2, e2e_p50=30, e2e_p95=40, e2e_p99=50,
                tokens_in_flight=100_000, output_tokens_per_s=200)
    return TenantObservation(**{**base, **kw})


def test_a_victim_at_risk_makes_the_tenant_that_can_wait_give_back():
    c = LedgerController()
    c.reset(spec(CHAT, BATCH))
    deltas = [c.act(obs([chat(slow=True), batch()], time_s=2.0 * i)) for i in range(1, 4)]
    # the chat tenant misses its TTFT with its own wait short: the engine is slow, the batch tenant pays
    assert all(d[0] == 0 for d in deltas)
    assert deltas[0][1] == -8  # toward floor(0.75 * 20) = 15 from 32, by at most max_step (8)
    # the misses stay in its 30 s history, and the donor may not grow for hold_s: no growth, backlog or not
    assert c.act(obs([chat(slow=False), batch(queue_depth=5, prompt_tokens_queued=20_000)], 8.0))[1] <= 0


def test_no_victim_no_cut_and_a_backlog_grows_within_the_kv_ledger():
    c = LedgerController()
    c.reset(spec(CHAT, BATCH))
    # nothing waits in the engine: K = 110,000 / 0.5 = 220,000 tokens; 85% of it is 187,000
    d = c.act(obs([chat(slow=False), batch(limit=20, queue_depth=10, prompt_tokens_queued=50_000)], 2.0, kv=0.5))
    assert c.kv_tokens == pytest.approx(220_000)
    # the batch tenant's requests hold 5,000 tokens each: 77,000 tokens of room fit 15, max_step allows 8
    assert d == [0, 8]
    # with the cache nearly full the same backlog gets only what fits
    tight = c.act(obs([chat(slow=False), batch(limit=20, queue_depth=10, tokens_in_flight=170_000)], 4.0, kv=0.82))
    assert tight[1] < 8


def test_the_kv_size_is_read_only_when_nothing_waits_in_the_engine():
    c = LedgerController()
    c.reset(spec(CHAT, BATCH))
    c.act(obs([chat(slow=False), batch()], 2.0, kv=0.4, waiting=12))  # tokens in flight not all in the cache
    assert c.kv_tokens == 0.0
    c.act(obs([chat(slow=False), batch()], 4.0, kv=0.4))
    assert c.kv_tokens == pytest.approx(110_000 / 0.4)


def test_least_served_backlogged_tenant_grows_first_when_room_is_short():
    c = LedgerController()
    two = spec(TenantSpec("a", slo_e2e_s=60.0), TenantSpec("b", slo_e2e_s=60.0))
    c.reset(two)
    a = dict(in_flight=10, limit=10, queue_depth=10, prompt_tokens_queued=10_000, tokens_in_flight=10_000)
    c.act(obs([TenantObservation(**a, output_tokens_per_s=5_000), TenantObservation(**a, output_tokens_per_s=10)],
              2.0, kv=0.1))
    # K = 200,000; 85% leaves 150,000 tokens of room: both fit, a has received more service than b
    assert c.service[0] > c.service[1]
    full = c.act(obs([TenantObservation(**{**a, "tokens_in_flight": 84_000}, output_tokens_per_s=5_000),
                      TenantObservation(**a, output_tokens_per_s=10)], 4.0, kv=0.47))
    # 170,000 − 94,000 = 76,000... only ~1,000-token footprints are unknown to nobody: room for b first
    assert full[1] >= full[0]


def test_token_best_walks_to_its_quotas_and_never_cuts_a_latency_tenant_below_them():
    class Quota:  # what static:best gives it: caps
        name = "static:q"
        cap = (16, 4)

        def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
            pass

    c = AroundBase(LedgerController(), Quota(), name="ledger:q")  # how the registry makes ledger:best
    c.reset(spec(CHAT, BATCH))
    assert c.name == "ledger:q" and c.inner.quota == [16, 4]
    first = c.act(obs([chat(slow=False), batch(in_flight=4)], 2.0))
    assert first == [-8, -8]  # the ramp: toward 16 and 4 by max_step
    ramp = c.act(obs([chat(slow=False, limit=24), batch(limit=24, in_flight=4)], 4.0))
    assert ramp == [-8, -8]
    at = [chat(slow=True, limit=16), batch(limit=4, in_flight=4)]
    c.act(obs([chat(slow=False, limit=16), batch(limit=8, in_flight=4)], 6.0))  # the batch ramp ends
    for i in range(4, 8):
        d = c.act(obs(at, 2.0 * i))
        assert d[1] == 0  # the donor has borrowed nothing: it keeps its quota
    # no victim, a backlogged tenant at its quota, chat not yet healthy with confidence: no loan
    c2 = LedgerController()
    c2.reset(spec(CHAT, BATCH), anchors=Quota.cap)
    c2.ramping = [False, False]
    d = c2.act(obs([chat(slow=False, limit=16), batch(limit=4, in_flight=4, queue_depth=6)], 2.0))
    assert d[1] == 0
    # after many healthy windows it lends, a bounded amount; an unused loan is given back
    for i in range(2, 20):
        d = c2.act(obs([chat(slow=False, limit=16, ttft_p99=0.1, ttft_p95=0.08),
                        batch(limit=4, in_flight=4, queue_depth=6, prompt_tokens_queued=6_000,
                              tokens_in_flight=8_000)], 2.0 * i))
        if d[1] > 0:
            break
    # once the Wilson upper bound on chat's misses is under half its 5% target (~10 healthy windows); the
    # loan is bounded by 3% of the KV size (~330,000 tokens learned): two of batch's ~4,500-token requests
    assert i >= 8 and 0 < d[1] <= 3
    back = c2.act(obs([chat(slow=False, limit=16), batch(limit=4 + d[1], in_flight=4)], 50.0))
    assert back[1] == -d[1]


@pytest.mark.parametrize("policy", ["ledger", "ledger:best"])
def test_whole_episodes_give_valid_deltas(policy: str) -> None:
    sc = load_scenario("long-context-chat", horizon_s=120)
    ctrl = make_controller(policy, scenario=sc)
    ctrl.reset(sc.control_spec(), seed=3)
    from admit.envs.simulation import Simulation

    sim = Simulation(sc, 3)
    seen: list[list[int]] = []
    act = ctrl.act

    def checked(o: Observation) -> list[int]:
        d = validate_deltas(act(o), sc.control_spec())
        seen.append(d)
        return d

    ctrl.act = checked  # type: ignore[method-assign]
    sim.run(ctrl, name=policy)
    assert len(seen) == math.ceil(120 / sc.interval_s)


def test_the_ledger_rescues_a_kv_cache_that_static_caps_thrash() -> None:
    """long-context-chat: default caps of 64 let long prompts overfill the KV cache; the ledger cuts the
    long-context tenant (it can wait) and the chat tenant keeps its objectives."""
    sc = load_scenario("long-context-chat", horizon_s=300)
    static = [run_policy(sc, "static", s)["goodput_rps"] for s in (0, 1)]
    token = [run_policy(sc, "ledger", s) for s in (0, 1)]
    assert all(t["goodput_rps"] > 2 * s for t, s in zip(token, static, strict=True))
    assert all(t["tenants"]["chat"]["attainment"] > 0.5 for t in token)


def test_the_registry_builds_both_and_refuses_other_arguments() -> None:
    assert make_controller("ledger").name == "ledger"
    assert make_controller("ledger:best").name == "ledger:best"
    with pytest.raises(ValueError, match="no argument or 'best'"):
        make_controller("ledger:7")
    with pytest.raises(ValueError, match="'token' is now called 'ledger': use 'ledger:best'"):
        make_controller("token:best")  # its former name points to the new one

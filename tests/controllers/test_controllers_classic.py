"""The classic adaptive-concurrency baselines: each update rule on hand-built observations."""

import math

import numpy as np
import pytest
from admit.agents.registry import make_controller
from admit.controllers.aimd import AIMDController
from admit.controllers.common import latency_kind, to_delta
from admit.controllers.envoy import EnvoyGradientController
from admit.controllers.gradient2 import Gradient2Controller
from admit.controllers.saturation import SaturationGateController
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec, Limits, TenantSpec
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import evaluate

# a token-engine-like spec: wide limits, max_step 4, TTFT objectives
TOKEN = ControlSpec(
    (TenantSpec("a", slo_ttft_p99_s=0.5, slo_e2e_p99_s=15.0), TenantSpec("b", slo_e2e_p99_s=120.0)),
    Limits(min=2, max=256, initial=64, max_step=4),
    interval_s=2.0,
    window_s=10.0,
    queue_timeout_s=30.0,
)
SLOT = load_scenario("seed-paper").control_spec()
CLASSIC = ("aimd", "gradient2", "envoy", "saturation")


def tenant(**kw) -> TenantObservation:
    base = {"limit": 64.0, "in_flight": 40.0, "samples": 50.0, "completions": 50.0, "ttft_p50": 0.1,
            "ttft_p95": 0.2, "ttft_p99": 0.3, "e2e_p50": 3.0, "e2e_p95": 6.0, "e2e_p99": 9.0,
            "slo_ttft_p99": 0.5, "slo_e2e_p99": 15.0}
    base.update(kw)
    return TenantObservation(**base)


def obs(*tenants, t=0.0, waiting=0.0, kv=0.1) -> Observation:
    return Observation(t, 10.0, kv, 10.0, waiting, list(tenants))


def test_latency_input_is_ttft_on_token_specs_and_e2e_on_the_slot_engine():
    assert latency_kind(TOKEN) == "ttft"
    assert latency_kind(SLOT) == "e2e"


def test_to_delta_is_clamped_to_max_step():
    assert to_delta(100.0, 64, 4) == 4
    assert to_delta(10.0, 64, 4) == -4
    assert to_delta(62.4, 64, 4) == -2


def test_aimd_multiplies_by_0_9_on_a_drop_and_adds_one_when_used():
    c = AIMDController()
    c.reset(TOKEN)
    c.L = [40.0, 40.0]
    d = c.act(obs(tenant(limit=40, drops=1), tenant(limit=40, in_flight=20, ttft_p99=0.1)))
    assert c.L == [36.0, 41.0]  # ⌊0.9·40⌋ and 40 + 1 (2·20 ≥ 40)
    assert d == [-4, 1]
    c.act(obs(tenant(limit=36, ttft_p99=0.9), tenant(limit=41, in_flight=10)))  # SLO miss counts as a drop
    assert c.L == [32.0, 41.0]  # ⌊0.9·36⌋; b holds: 2·10 < 41


def test_gradient2_holds_when_app_limited_and_follows_the_formula_otherwise():
    c = Gradient2Controller()
    c.reset(TOKEN)
    c.L, c.long, c.count = [40.0, 40.0], [0.2, 0.2], [100.0, 100.0]
    c.act(obs(tenant(limit=40, in_flight=10, ttft_p50=0.4), tenant(limit=40, in_flight=30, ttft_p50=0.4)))
    assert c.L[0] == 40.0  # in_flight < L/2: hold
    a = 1 - (1 - 2 / 601) ** (50 * 0.2)
    long = (1 - a) * 0.2 + a * 0.4
    g = min(1.0, max(0.5, 1.5 * long / 0.4))
    assert c.L[1] == pytest.approx(0.8 * 40 + 0.2 * (40 * g + 4))
    assert c.L[1] < 40  # latency doubled: the limit comes down


def test_gradient2_decays_the_long_average_after_a_jam():
    c = Gradient2Controller()
    c.reset(TOKEN)
    c.long, c.count = [2.0, 2.0], [100.0, 100.0]
    c.act(obs(tenant(ttft_p50=0.1), tenant(ttft_p50=0.1)))
    a = 1 - (1 - 2 / 601) ** 10
    assert c.long[0] == pytest.approx(0.95 * ((1 - a) * 2.0 + a * 0.1))


def test_envoy_grows_by_sqrt_when_sample_is_within_the_buffer_and_halves_when_slow():
    c = EnvoyGradientController()
    c.reset(TOKEN, seed=1)
    c.L, c.min_rtt, c.measured = [16.0, 16.0], [0.1, 0.1], [True, True]
    c.act(obs(tenant(ttft_p50=0.125, limit=16), tenant(ttft_p50=1.0, limit=16), t=2.0))
    assert c.L[0] == pytest.approx(16 + 4)  # g = 1: L + √L
    assert c.L[1] == pytest.approx(8 + math.sqrt(8))  # g clamped at 0.5: L/2 + √(L/2)


def test_envoy_remeasures_min_rtt_from_live_traffic_with_seeded_jitter():
    a, b, c = EnvoyGradientController(), EnvoyGradientController(), EnvoyGradientController()
    a.reset(TOKEN, seed=7)
    b.reset(TOKEN, seed=7)
    c.reset(TOKEN, seed=8)
    assert a.epoch_end == b.epoch_end != c.epoch_end
    assert all(60.0 <= e < 69.0 for e in a.epoch_end)
    # first epoch: min of samples; at its end the epoch's minimum replaces it (the baseline moved up)
    a.act(obs(tenant(ttft_p50=0.1), tenant(ttft_p50=0.1), t=2.0))
    for k in range(34):  # until the first epoch ends (60–69 s): it saw 0.1
        a.act(obs(tenant(ttft_p50=0.3), tenant(ttft_p50=0.3), t=4.0 + 2 * k))
    assert a.min_rtt == [0.1, 0.1] and a.measured == [True, True]
    for k in range(34, 80):  # the second epoch (ends by 138 s) saw only 0.3
        a.act(obs(tenant(ttft_p50=0.3), tenant(ttft_p50=0.3), t=4.0 + 2 * k))
    assert a.min_rtt == [0.3, 0.3]
    assert all(limit > 2 for limit in a.L)  # never pinned to the floor to measure


def test_saturation_gate_lowers_when_waiting_reaches_5_or_kv_0_8():
    c = SaturationGateController()
    c.reset(TOKEN)
    assert c.act(obs(tenant(), tenant(), waiting=5)) == [-4, -4]
    assert c.act(obs(tenant(), tenant(), kv=0.8)) == [-4, -4]
    assert c.act(obs(tenant(), tenant(), waiting=4, kv=0.79)) == [4, 4]


@pytest.mark.parametrize("name", CLASSIC)
def test_deltas_stay_within_max_step_and_are_deterministic(name):
    rng = np.random.default_rng(3)
    seq = []
    for k in range(200):
        ts = [tenant(limit=float(rng.integers(2, 257)), in_flight=float(rng.integers(0, 256)),
                     ttft_p50=float(rng.uniform(0.01, 2)), drops=float(rng.integers(0, 2)),
                     ttft_p99=float(rng.uniform(0.01, 3))) for _ in range(2)]
        seq.append(obs(*ts, t=2.0 * k, waiting=float(rng.integers(0, 8)), kv=float(rng.uniform(0, 1))))
    runs = []
    for _ in range(2):
        c = make_controller(name)
        c.reset(TOKEN, seed=11)
        out = [c.act(o) for o in seq]
        assert all(type(d) is int and -4 <= d <= 4 for ds in out for d in ds)
        runs.append(out)
    assert runs[0] == runs[1]


def test_short_evaluation_on_seed_paper_runs():
    ev = evaluate("seed-paper", ["static", *CLASSIC], seeds=2).to_json()
    for name in CLASSIC:
        m = ev["policies"][name]
        assert 0.5 < m["throughput_rps"]["mean"] <= ev["policies"]["static"]["throughput_rps"]["mean"] + 0.01

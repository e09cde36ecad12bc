import numpy as np
import pytest
from admit.envs.workload import (
    MMPP,
    ConstantSize,
    Diurnal,
    Gamma,
    LognormalSize,
    Poisson,
    Trace,
    draw_tenant,
    load_trace,
)


def rng(seed=0):
    return np.random.default_rng(seed)


def test_poisson_rate_and_exponential_gaps():
    t = Poisson(rate=5.0).times(rng(), 2000.0)
    assert abs(len(t) / 2000.0 - 5.0) < 0.15
    gaps = np.diff(t)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # CV of exponential = 1
    assert np.all(np.diff(t) >= 0) and t[-1] < 2000.0


def test_gamma_burstiness_controls_cv():
    smooth = np.diff(Gamma(rate=4.0, burstiness=4.0).times(rng(), 2000.0))
    bursty = np.diff(Gamma(rate=4.0, burstiness=0.25).times(rng(), 2000.0))
    assert smooth.std() / smooth.mean() < 0.6 < 1.5 < bursty.std() / bursty.mean()


def test_mmpp_mean_rate_and_burstiness():
    m = MMPP(rate_on=4.0, rate_off=0.2, mean_on_s=20, mean_off_s=60)
    counts = []
    for s in range(20):
        counts.append(len(m.times(rng(s), 3600.0)) / 3600.0)
    assert abs(np.mean(counts) - m.mean_rate) / m.mean_rate < 0.1
    per_10s = np.histogram(m.times(rng(1), 3600.0), bins=360, range=(0, 3600))[0]
    assert per_10s.var() / per_10s.mean() > 3  # overdispersed, unlike Poisson (ratio 1)


def test_diurnal_follows_its_rate_curve():
    d = Diurnal(rate=10.0, amplitude=0.8, period_s=1000.0)
    t = d.times(rng(), 1000.0)
    first_half = np.sum(t < 500) / 500
    second_half = np.sum(t >= 500) / 500
    assert first_half > 1.5 * second_half  # sin is positive on the first half-period


def test_builtin_azure_trace_is_shipped_and_parsed():
    t, p, o = load_trace("azure-2023-code")
    assert len(t) == 8819
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert 3400 < t[-1] < 3500
    assert p.mean() == pytest.approx(2048, rel=0.01)
    assert o.mean() == pytest.approx(27.9, rel=0.01)
    t2, _, _ = load_trace("azure-2023-conv")
    assert len(t2) == 19366


def test_trace_replay_speedup_offset_and_loop(tmp_path):
    f = tmp_path / "tiny.csv"
    f.write_text("arrival,prompt_tokens,output_tokens\n0,10,5\n1,20,6\n2,30,7\n")
    tr = Trace(source=str(f), speedup=2.0, offset_s=1.0, loop=True)
    times, prompt, output = tr.rows(horizon_s=5.0)
    assert times.tolist() == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]
    assert prompt.tolist()[:4] == [10, 20, 30, 10]


def test_bad_trace_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="neither a builtin trace"):
        load_trace(str(tmp_path / "missing.csv"))
    f = tmp_path / "bad.csv"
    f.write_text("when,prompt_tokens,output_tokens\n0,1,1\n")
    with pytest.raises(ValueError, match=r"missing column\(s\) TIMESTAMP "):
        load_trace(str(f))
    g = tmp_path / "bad2.csv"
    g.write_text("arrival,prompt_tokens,output_tokens\n0,abc,1\n")
    with pytest.raises(ValueError, match="line 2"):
        load_trace(str(g))


def test_same_seed_same_draw():
    spec = (Poisson(rate=2.0), LognormalSize(median=500, sigma=1.0), ConstantSize(value=64))
    a = draw_tenant(*spec, rng(7), 100.0)
    b = draw_tenant(*spec, rng(7), 100.0)
    c = draw_tenant(*spec, rng(8), 100.0)
    assert np.array_equal(a.times, b.times) and np.array_equal(a.prompt, b.prompt)
    assert np.array_equal(a.u_service, b.u_service)
    assert not np.array_equal(a.times[:5], c.times[:5])


def test_trace_rotation_keeps_every_request_and_differs_by_seed(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival,prompt_tokens,output_tokens\n" + "".join(f"{i},{10 + i},{i + 1}\n" for i in range(10)))
    tr = Trace(source=str(f), random_shift_max_s=100.0)
    a_t, a_p, _ = tr.rows(1000.0, episode_seed=1)
    b_t, b_p, _ = tr.rows(1000.0, episode_seed=2)
    c_t, _, _ = tr.rows(1000.0, episode_seed=1)
    assert sorted(a_p.tolist()) == sorted(b_p.tolist()) == list(range(10, 20))  # same requests, rotated
    assert np.array_equal(a_t, c_t) and not np.array_equal(a_t, b_t)
    assert np.all(np.diff(a_t) >= 0) and a_t.min() >= 0 and a_t.max() < 10.0 + 1e-9
    # the rotation keeps gaps: the multiset of gaps (cyclically, span 10 s) is unchanged
    gaps = np.sort(np.diff(np.concatenate([a_t, [a_t[0] + 10.0]])))
    assert np.allclose(gaps, 1.0)


def test_scenario_and_load_generator_share_one_definition_of_each_process_and_size():
    from admit.core import workload as core
    from admit.envs.scenario import ScenarioError, parse_scenario
    from admit.loadgen.arrivals import ArrivalSpec
    from admit.loadgen.lengths import parse_length

    assert Poisson is core.Poisson and LognormalSize is core.LognormalSize  # envs re-exports core's models
    assert isinstance(ArrivalSpec("gamma", 20.0, burstiness=0.5).to_process(), core.Gamma)
    assert ArrivalSpec("ramp", 30.0, rate_start=10.0).to_process() == core.Ramp(rate=30.0, rate_start=10.0)
    assert parse_length("lognormal:256:0.8:max=2048").spec == core.LognormalSize(median=256, sigma=0.8, max=2048)
    # one check, one message, whichever spelling: the flat loadgen keys and the scenario's mapping
    with pytest.raises(ValueError, match="rate: Input should be greater than 0"):
        ArrivalSpec("poisson", 0.0)
    d = {"name": "x", "horizon_s": 10, "interval_s": 1, "window_s": 2,
         "engine": {"kind": "slot", "slots": 1, "mean_service_s": 1},
         "tenants": [{"name": "a", "arrival": {"kind": "poisson", "rate": 0},
                      "prompt_tokens": {"kind": "constant", "value": 1},
                      "output_tokens": {"kind": "constant", "value": 1}}]}
    with pytest.raises(ScenarioError, match=r"tenants\.0\.arrival\.poisson\.rate: Input should be greater than 0"):
        parse_scenario(d)
    # what was the load generator's alone is a scenario's too
    d["tenants"][0]["arrival"] = {"kind": "ramp", "rate": 4, "rate_start": 1}
    d["tenants"][0]["prompt_tokens"] = {"kind": "normal", "mean": 64, "std": 8}
    d["tenants"][0]["output_tokens"] = {"kind": "exponential", "mean": 16, "max": 64}
    assert parse_scenario(d).tenants[0].arrival == core.Ramp(rate=4, rate_start=1)
    d["tenants"][0]["prompt_tokens"] = {"kind": "uniform", "low": 5, "high": 2}  # refused when read, not at reset
    with pytest.raises(ScenarioError, match="uniform size needs low <= high"):
        parse_scenario(d)


def test_constant_phase_zero_is_the_exact_grid_and_random_is_the_simulators():
    from admit.core.workload import Constant

    assert Constant(rate=4.0, phase="zero").times(rng(), 2.0).tolist() == [i / 4 for i in range(8)]
    t = Constant(rate=4.0).times(rng(), 2.0)
    assert 0 < t[0] < 0.25 and np.allclose(np.diff(t), 0.25)


def test_ramp_rate_grows_linearly_over_the_horizon():
    from admit.core.workload import Ramp

    t = Ramp(rate=300.0, rate_start=100.0).times(rng(1), 10.0)
    assert abs((t < 5).sum() - 750) < 4 * np.sqrt(750) and abs((t >= 5).sum() - 1250) < 4 * np.sqrt(1250)

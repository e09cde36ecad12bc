"""The token-engine scenarios: they load, the env runs them, evaluate works on them."""

import warnings

import gymnasium
import numpy as np
import pytest
import yaml
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import bundled_scenarios, load_scenario, parse_scenario
from admit.envs.servegen import ServeGenArrivals, skewed_scenario
from admit.envs.simulation import Simulation
from admit.evaluate.offline import evaluate
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

TOKEN_SCENARIOS = ["h200-azure-2023", "h200-mixed", "servegen-skewed"]


def short(name: str, horizon: float = 60.0):
    d = load_scenario(name).model_dump()
    d["horizon_s"] = horizon
    return parse_scenario(d)


def test_bundled():
    assert set(TOKEN_SCENARIOS) <= set(bundled_scenarios())


@pytest.mark.parametrize("name", TOKEN_SCENARIOS)
def test_env_checkers_pass_on_token_scenarios(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gymnasium.make("admit/TenantAdmission-v1", scenario=short(name)).unwrapped)
        sb3_check_env(gymnasium.make("admit/TenantAdmission-v1", scenario=short(name)).unwrapped, warn=True)


@pytest.mark.parametrize("name", TOKEN_SCENARIOS)
def test_token_env_reports_ttft_kv_usage_and_is_deterministic(name):
    def run(seed):
        env = TenantAdmissionEnv(short(name, 40.0))
        obs, _ = env.reset(seed=seed)
        rows = []
        for _ in range(20):
            obs, _, _, _, _ = env.step(np.full(env.n, env.k))  # hold
            rows.append(obs)
        return np.array(rows), env.last_observation

    a, last = run(1)
    b, _ = run(1)
    assert np.array_equal(a, b)
    assert 0.0 <= last.gpu_mem_util <= 1.0
    busy = [t for t in last.tenants if t.samples > 0]
    assert busy, "some tenant completed requests in the window"
    for t in busy:
        assert 0 < t.ttft_p50 <= t.e2e_p50  # TTFT is part of the end-to-end latency
        assert t.ttft_p99 <= t.e2e_p99 + 1e-9


def test_azure_scenario_replays_the_real_trace():
    sc = load_scenario("h200-azure-2023")
    sim = Simulation(sc, 0)
    by_tenant = np.bincount([r.tenant for r in sim._requests])
    assert by_tenant.tolist() == [8819, 19366]  # every request of both files, within the hour


def test_kv_usage_rises_under_load():
    sc = short("h200-mixed", 120.0)
    sim = Simulation(sc, 0)
    sim.advance(60.0)
    obs = sim.observe()
    assert obs.gpu_mem_util > 0.01
    assert obs.engine_running > 0


def test_servegen_scenario_file_is_what_the_generator_writes():
    bundled = load_scenario("servegen-skewed")
    assert bundled == parse_scenario(yaml.safe_load(yaml.safe_dump(skewed_scenario())))
    assert len(bundled.tenants) == 8


def test_servegen_arrivals_follow_the_table_rate():
    # client 61, 14:00-14:30 on day 1: the table's mean rate over the three windows
    from admit.envs.servegen import _windows

    rows = [r for r in _windows()[61] if 50400 <= r[0] < 52200]
    want = np.mean([r[1] for r in rows])
    got = [
        len(ServeGenArrivals(client_id=61, start_s=50400).times(np.random.default_rng(s), 1800.0)) / 1800
        for s in range(5)
    ]
    assert np.mean(got) == pytest.approx(want, rel=0.1)
    with pytest.raises(ValueError, match="no client 9999"):
        ServeGenArrivals(client_id=9999).times(np.random.default_rng(0), 10.0)


def test_evaluate_runs_on_a_token_scenario():
    ev = evaluate(short("h200-mixed", 60.0), ["static", "static:16"], seeds=2).to_json()
    for p in ("static", "static:16"):
        assert ev["policies"][p]["throughput_rps"]["mean"] > 0


def test_a_warmup_serves_its_requests_but_keeps_them_out_of_every_figure():
    """``warmup_s``: the same world, decision for decision; the requests that arrived before it are counted in
    ``warmup_totals`` alone, so totals + warm-up totals are the run without one, and rates are over the rest."""
    from admit.agents.registry import make_controller

    sc = load_scenario("h200-live-small", horizon_s=40.0)
    runs = []
    for warm in (0.0, 10.0):
        ctrl = make_controller("aimd")  # it reacts to what it sees: a warm-up that changed the world shows here
        ctrl.reset(sc.control_spec(), 2)
        sim = Simulation(sc, 2, warmup_s=warm)
        runs.append((sim, sim.run(ctrl, until=sc.horizon_s + 30)))
    (plain, plain_stats), (warm, warm_stats) = runs
    assert plain_stats == warm_stats  # the same decisions and limits
    early = sum(1 for r in plain.requests if r.arrival < 10.0 and r.arrival < sc.horizon_s)
    assert early > 0 and sum(t.arrived for t in warm.warmup_totals) == early
    for k in range(len(sc.tenants)):
        for field in ("arrived", "completed", "good", "dropped", "rejected", "output_tokens"):
            assert getattr(warm.totals[k], field) + getattr(warm.warmup_totals[k], field) == \
                getattr(plain.totals[k], field), field
        assert sorted(warm.totals[k].e2e + warm.warmup_totals[k].e2e) == sorted(plain.totals[k].e2e)
    assert warm.summary()["goodput_rps"] == pytest.approx(sum(t.good for t in warm.totals) / 30.0)
    with pytest.raises(ValueError, match="warmup_s must be >= 0 and < the horizon"):
        Simulation(sc, 2, warmup_s=40.0)

"""The benchmarks' peers model what admit models: a peer that served other requests would make a speed ratio
meaningless, so these check the peers against admit's simulator on the same seeds."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import run_policy

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


@pytest.fixture(scope="module")
def simpy_peer():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import simpy_peer

        yield simpy_peer
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("policy", ["static", "naive", "differentiated"])
def test_simpy_peer_serves_the_same_requests_as_admit_seed_by_seed(simpy_peer, policy: str) -> None:
    sc = load_scenario("seed-paper", horizon_s=600.0)
    for seed in (0, 1):
        ours, peer = run_policy(sc, policy, seed), simpy_peer.simpy_rollout(sc, policy, seed)
        for metric in ("throughput_rps", "p99_s", "p50_s", "dropped"):
            assert peer[metric] == pytest.approx(ours[metric], rel=1e-9, abs=1e-12), (policy, seed, metric)
    assert ours["dropped"] > 0 or policy == "static"  # the heuristics shed load: the gate and timeouts matter


def test_family_train_speed_measures_the_steps_it_was_asked_for_and_splits_them() -> None:
    """One measurement of benchmarks/family_train_speed.py on a tiny family recipe: the steps timed are the
    steps asked for (whole rollouts), and the rollout and update phases account for the wall time."""
    import json
    import subprocess

    sets = ["n_envs=2", "hyperparams.n_steps=16", "hyperparams.batch_size=16", "hyperparams.n_epochs=1",
            "policy.hidden=8", "vec_env=dummy", "update_threads=2"]
    arg = json.dumps(["train/configs/ppo-general-fast.yaml", sets, 64])
    out = subprocess.run([sys.executable, str(BENCHMARKS / "family_train_speed.py"), "--child", arg],
                         cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["steps"] == 64 and res["steps_per_s"] == pytest.approx(64 / res["wall_s"])
    assert res["rollout_s"] > 0 and res["update_s"] > 0
    phases = res["rollout_s"] + res["update_s"]
    assert 0.7 * res["wall_s"] <= phases <= res["wall_s"] + 1e-6  # learn's own set-up is the rest
    assert res["trainer_max_rss_mb"] > 50


def test_why_shifts_rule_lends_only_while_the_lender_idles() -> None:
    """benchmarks/why_shift.py's pair rule: caps held while the lender works, the borrower's cap times the factor
    while the lender's rate is under 15 % of its recent peak with nothing queued, and back at once after."""
    from admit.core.observation import Observation, TenantObservation

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import why_shift
    finally:
        sys.path.remove(str(BENCHMARKS))
    spec = load_scenario("h200-shift@0").control_spec()
    caps = [2] + [64] * (spec.n_tenants - 1)
    rule = why_shift.PairLend(caps, borrower=0, lender=1, factor=8)
    rule.reset(spec)

    def obs(lender_arrivals: float, queued: float = 0.0) -> Observation:
        ts = [TenantObservation(limit=float(c)) for c in caps]
        ts[1].arrivals, ts[1].queue_depth = lender_arrivals, queued
        return Observation(0.0, 10.0, 0.0, 0.0, 0.0, ts)

    assert rule.act(obs(50)) == [0] * spec.n_tenants  # working: hold
    assert rule.act(obs(5))[0] == 14  # 0.5 req/s of a 5 req/s peak: idle, so 2 -> 16 (one step of at most 16)
    assert rule.act(obs(5, queued=3))[0] == 0  # something queued: not idle
    assert rule.act(obs(40))[0] == 0  # working again: the target is the cap


def test_env_step_cost_prices_contracts_on_this_revision_alone() -> None:
    """benchmarks/env_step_cost.py --contracts without --before: this revision with a contract on every tenant
    (at its own mean rate, so the scenario accepts them) against itself without, steps and resets."""
    import subprocess

    out = subprocess.run([sys.executable, str(BENCHMARKS / "env_step_cost.py"), "--contracts", "--env-id",
                          "admit/TenantAdmission-v1", "--scenario", "servegen-skewed", "--steps", "300", "--repeat",
                          "1", "--resets", "1"], cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600,
                         check=True).stdout
    assert "servegen-skewed: step after/before median" in out and "servegen-skewed: reset after/before median" in out


def test_rollout_cost_prices_an_episodes_contract_figures() -> None:
    """benchmarks/rollout_cost.py without --before: evaluation episodes with a contract on every tenant against
    the same revision without, each side reporting its episodes' figures per tenant (more with contracts)."""
    import subprocess

    out = subprocess.run([sys.executable, str(BENCHMARKS / "rollout_cost.py"), "--scenario", "h200-live-small",
                          "--policy", "static", "--episodes", "1", "--repeat", "1"], cwd=BENCHMARKS.parent,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    assert "h200-live-small static: episode after/before median" in out
    figures = re.search(r"\((\d+) figures per tenant\), before [\d.]+ ms/episode \((\d+)\)", out)
    assert figures is not None and int(figures[1]) > int(figures[2])


def test_learning_cost_late_oracle_is_the_operators_limits_then_the_tuned_caps() -> None:
    """benchmarks/learning_cost.py: static:contract's caps reached after T seconds. Reached after the horizon, the
    episode is plain `static`'s (the operator's limits throughout), seed by seed; reached after 30 s of the
    2-minute episode, it differs from static:contract's and from static's; the table row carries RESULTS'
    verdict."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import learning_cost
    finally:
        sys.path.remove(str(BENCHMARKS))
    sc = load_scenario("h200-live-small")
    never = learning_cost.table("h200-live-small", [sc.horizon_s + 1, 30.0], 3, 1)
    late, never_p = never["policies"][learning_cost.label(30.0)], never["policies"][
        learning_cost.label(sc.horizon_s + 1)]
    assert never_p["goodput_rps"]["values"] == [run_policy(sc, "static", s)["goodput_rps"] for s in range(3)]
    tuned = never["policies"][learning_cost.BASE]["goodput_rps"]["values"]
    assert late["goodput_rps"]["values"] not in (tuned, never_p["goodput_rps"]["values"])
    line, figures = learning_cost.row("h200-live-small", never, [30.0])
    assert line.startswith("| h200-live-small | ") and figures["30"]["verdict"] in (
        "wins", "ties", "loses")


def test_gateway_bench_runs_a_redis_gateway_with_a_contract_beside_one_without(tmp_path: Path) -> None:
    """benchmarks/gateway_bench.py --workers 2 --contract: the Redis-backed gateway with the contract on its
    tenant runs beside the one without, in the same stages, each with its CPU per request (workers + its own
    redis-server) and latency measured, so their ratio is the contract's price (docs/BENCHMARKS.md)."""
    import json
    import shutil
    import subprocess

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "gateway_bench.py"), "--rates", "100", "--duration", "3",
                    "--warmup", "1", "--max-rates", "", "--workers", "2", "--only", "gateway x2,contract x2",
                    "--contract", '{"requests_per_s": 750, "burst": 100, "attainment": 0.9}', "--out", str(out)],
                   cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(out.read_text())
    assert result["max_rate"] == {}  # --max-rates '': no ladder
    stages = result["overhead"]
    assert {(s["shape"], s["rate"]) for s in stages} == {("plain", 100.0), ("stream", 100.0)}
    for stage in stages:
        assert set(stage) >= {"direct", "gateway x2", "contract x2"}
        for label in ("gateway x2", "contract x2"):
            r = stage[label]
            assert r["achieved_ratio"] > 0.9 and r["p50_ms"] > 0 and r["proxy_cpu_ms_per_request"] > 0

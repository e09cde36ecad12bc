"""`admit protocol` (admit.live.protocol): repeats × policies live on the same requests, resumable, with
admit evaluate's statistics; end to end against the emulator on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from admit.evaluate.offline import CONTRACT_METRICS
from admit.evaluate.verdict import verdicts
from admit.live.protocol import METRICS, TENANT_METRICS, aggregate, run_order
from typer.testing import CliRunner

from admit.cli import app

POLICIES = ["static", "static:best"]


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


def test_each_repeat_runs_the_policies_in_an_order_drawn_from_its_seed() -> None:
    pols = ["a", "b", "c", "d"]
    orders = [run_order(pols, s) for s in range(20)]
    assert all(sorted(o) == pols for o in orders)
    assert orders == [run_order(pols, s) for s in range(20)]  # reproducible: the seed alone decides
    assert len({tuple(o) for o in orders}) > 5  # and it does shuffle


def _episode(goodput: float, attain: tuple[float, float]) -> dict[str, Any]:
    ep: dict[str, Any] = {m: 0.0 for m in METRICS}
    ep.update(goodput_rps=goodput, attainment=sum(attain) / 2, worst_attainment=min(attain))
    ep["tenants"] = {n: {**{m: 0.0 for m in TENANT_METRICS}, "attainment": a, "goodput_rps": goodput / 2}
                     for n, a in zip(("x", "y"), attain, strict=True)}
    return ep


def test_a_repeat_with_an_invalid_run_is_excluded_for_every_policy_and_said_why() -> None:
    seeds = list(range(8))
    runs = {}
    for s in seeds:
        for p, g in (("base", 1.0), ("new", 2.0)):
            bad = s == 3 and p == "new"
            runs[f"{s}/{p}"] = {"valid": not bad, "invalid_reasons": ["send lag p99 812 ms > 50 ms"] if bad else [],
                                "episode": _episode(100.0 if bad else g + 0.01 * s, (0.9, 0.95)),
                                "simulated": _episode(g, (0.9, 0.95))}
    out = aggregate("sc", 30.0, ["base", "new"], seeds, runs, simulate=True)
    assert out["valid_repeats"] == [0, 1, 2, 4, 5, 6, 7]
    assert out["excluded"] == [{"seed": 3, "reasons": ["new: send lag p99 812 ms > 50 ms"]}]
    res = out["results"]
    assert res["seed_list"] == out["valid_repeats"]
    new = res["policies"]["new"]
    assert 100.0 not in new["goodput_rps"]["values"]  # never averaged in
    assert len(res["policies"]["base"]["goodput_rps"]["values"]) == 7  # the baseline's run of seed 3 left out too
    assert verdicts(res)["new"].outcome == "wins"  # 7 pairs, all higher: p < 0.05
    assert out["simulated"]["seed_list"] == seeds  # the simulator's twin cannot fall behind: every repeat


def test_every_invalid_repeat_leaves_no_statistics_and_says_so() -> None:
    runs = {"0/a": {"valid": False, "invalid_reasons": ["achieved 40% of the rate"], "episode": _episode(1, (1, 1))}}
    out = aggregate("sc", 30.0, ["a"], [0], runs, simulate=False)
    assert out["results"] is None and out["excluded"][0]["reasons"] == ["a: achieved 40% of the rate"]


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["protocol", *args], catch_exceptions=False)


def test_the_protocol_runs_live_on_the_emulator_resumes_and_refuses_another_protocols_file(tmp_path: Path) -> None:
    out, plot = tmp_path / "protocol.json", tmp_path / "pareto.png"
    args = ["--scenario", "h200-live-small", "--repeats", "2", "--duration", "6", "--simulate", "--out", str(out)]
    for p in POLICIES:
        args += ["--policy", p]
    first = _cli(*args, "--plot", str(plot))
    assert first.exit_code == 0, first.output
    data = json.loads(out.read_text())
    proto = data["protocol"]
    assert proto["repeats"] == 2 and proto["policies"] == POLICIES and proto["seed_base"] == 0
    assert sorted(data["runs"]) == ["0/static", "0/static:best", "1/static", "1/static:best"]
    for key, rec in data["runs"].items():
        seed, pol = key.split("/", 1)
        assert proto["orders"][seed].index(pol) == rec["position"]
        assert rec["valid"] == (not rec["invalid_reasons"])  # a loaded machine may fall behind: said why
        ep = rec["episode"]
        arrived = sum(t["arrived"] for t in ep["tenants"].values())
        assert arrived > 0 and 0.0 <= ep["attainment"] <= 1.0 and ep["goodput_rps"] <= ep["throughput_rps"] + 1e-9
        # h200-live-small's tenants have contracts: the episode carries their figures too
        assert set(ep) - {"tenants"} == {*METRICS, *CONTRACT_METRICS} and set(rec["simulated"]) == set(ep)
        assert rec["load"]["achieved_ratio"] > 0  # the load generator's own validity, kept per run
        backend = rec["backend"]  # the emulator's /metrics, scraped while the run was in flight
        assert backend["samples"] >= 2 and backend["scrape_failures"] == 0
        assert 0.0 < backend["kv_usage_peak"] <= 1.0 and backend["preemptions"] >= 0
        assert backend["backend_finished"] > 0 and backend["in_engine_peak"] >= 1
        # the same requests for both policies of a repeat: common random numbers, live
    for seed in ("0", "1"):
        counts = {p: sum(t["arrived"] for t in data["runs"][f"{seed}/{p}"]["episode"]["tenants"].values())
                  for p in POLICIES}
        assert len(set(counts.values())) == 1, counts
    valid = [s for s in (0, 1) if all(data["runs"][f"{s}/{p}"]["valid"] for p in POLICIES)]
    assert data["valid_repeats"] == valid and [x["seed"] for x in data["excluded"]] == [s for s in (0, 1)
                                                                                       if s not in valid]
    block = data["simulated"]  # admit evaluate's schema; the twin covers every repeat
    assert list(block["policies"]) == POLICIES and block["seeds"] == 2
    assert set(block["policies"]["static"]["tenants"]) == {"chat", "agent"} and "live only" in first.output
    if valid:  # on an idle machine both repeats (6 s of light load keeps the schedule); a loaded one may lose one
        assert list(data["results"]["policies"]) == POLICIES and data["results"]["seeds"] == len(valid)
        assert "live against its simulated twin" in first.output and plot.stat().st_size > 0
    walls = {k: r["wall_s"] for k, r in data["runs"].items()}

    again = _cli(*args)  # the same protocol again: every run is found done, none is run twice
    assert again.exit_code == 0, again.output
    assert "4 runs done earlier, 0 to go" in again.output
    assert {k: r["wall_s"] for k, r in json.loads(out.read_text())["runs"].items()} == walls

    before = out.read_bytes()
    other = CliRunner().invoke(app, ["protocol", *args, "--policy", "aimd"])
    assert other.exit_code == 2 and "holds another protocol" in other.output and "policies" in other.output
    assert out.read_bytes() == before  # refused, nothing lost


def test_a_warmup_and_a_load_reach_the_live_runs_the_twin_and_the_file(tmp_path: Path) -> None:
    """``--warmup 3 --load 1.5``: each run plays the scenario's requests at 1.5 × its rates, and the requests of
    the first 3 s are served but counted neither live nor in the twin, so both count exactly the requests that
    arrive after it; the gateway's own part of the TTFT is measured per run; another warm-up is another
    protocol."""
    from admit.envs.scenario import load_scenario
    from admit.live.fidelity_real import scaled
    from admit.live.sim2live import replay_requests

    out = tmp_path / "p.json"
    args = ["--scenario", "h200-live-small", "--policy", "static", "--policy", "aimd", "--repeats", "1",
            "--duration", "8", "--warmup", "3", "--load", "1.5", "--simulate", "--out", str(out)]
    res = _cli(*args)
    assert res.exit_code == 0, res.output
    assert "load × 1.5, first 3 s a warm-up" in res.output
    data = json.loads(out.read_text())
    assert data["protocol"]["warmup_s"] == 3.0 and data["protocol"]["load"] == 1.5
    requests = replay_requests(scaled(load_scenario("h200-live-small", horizon_s=8.0), 1.5), 0)
    after = sum(r.arrival >= 3.0 for r in requests)
    assert 0 < after < len(requests)
    for rec in data["runs"].values():
        live = sum(t["arrived"] for t in rec["episode"]["tenants"].values())
        twin = sum(t["arrived"] for t in rec["simulated"]["tenants"].values())
        assert live == twin == after, (live, twin, after)
        gw = rec["gateway"]  # the gateway's own part of each answered request's TTFT
        assert gw["requests"] > 0 and 0 <= gw["p50_ms"] <= gw["p99_ms"]
        assert gw["p50_ms"] < rec["episode"]["ttft_p50_s"] * 1000  # the backend's part is not in it
    other = CliRunner().invoke(app, ["protocol", *[a if a != "3" else "2" for a in args]])
    assert other.exit_code == 2 and "warmup_s 3.0 (asked: 2.0)" in other.output, other.output


# below each tenant's rate (the agent's bursts at 6/s), so some of its requests are excess
CONTRACTS = {"chat": {"requests_per_s": 1.0, "burst": 2, "attainment": 0.95},
             "agent": {"requests_per_s": 1.0, "burst": 3, "attainment": 0.9}}


def test_with_contracts_the_live_runs_measure_them_from_the_gateways_classes(tmp_path: Path) -> None:
    """h200-live-small with a contract on each tenant (requests per second, so the gateway's classes can be
    replayed from its log alone): the gateway gets each tenant's contract, every run carries the contract
    figures live as its simulated twin does, consistent with its arrivals, the statistics judge by the
    contracts (evaluate/verdict.py) in the JSON and the table, and every request's class in the gateway's log
    is core/contract.py's on the times its meter saw them (``contract_at``)."""
    import yaml
    from admit.core.contract import Contract, classify
    from admit.envs.scenario import load_scenario

    data = load_scenario("h200-live-small").model_dump(mode="json", exclude_none=True)
    for t in data["tenants"]:
        t["contract"] = CONTRACTS[t["name"]]
    scenario = tmp_path / "h200-live-small-contracts.yaml"
    scenario.write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_scenario(str(scenario)).has_contracts
    out, work = tmp_path / "p.json", tmp_path / "work"
    res = _cli("--scenario", str(scenario), "--policy", "static", "--policy", "aimd", "--repeats", "1",
               "--duration", "8", "--simulate", "--workdir", str(work), "--out", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    for key, rec in data["runs"].items():
        for side in ("episode", "simulated"):
            ep = rec[side]
            assert ep["contracts"] == 2.0 and 0.0 <= ep["contracts_met"] <= 2.0, (key, side)
            assert ep["contract_shortfall"] >= 0 and 0.0 < ep["jain_share"] <= 1.0 + 1e-9
            for name, t in ep["tenants"].items():
                assert 0 <= t["contract_good"] <= t["contract_arrived"] <= t["arrived"], (key, side, name, t)
                if side == "simulated":  # live, ``good`` is the client's count; the per-request test the gateway's
                    assert t["contract_good"] <= t["good"]
                n, g = t["contract_arrived"], t["contract_good"]
                assert t["contract_attainment"] == pytest.approx(g / n if n else 1.0)
                assert t["contract_met"] == float(t["contract_shortfall"] == 0)
                # the lending figures, live from the gateway's request log as offline from the world's columns
                assert t["borrowed"] >= 0.0 and t["lent"] >= 0.0 and t["excess_goodput"] >= 0.0, (key, side, t)
            assert ep["contracts_met"] == sum(t["contract_met"] for t in ep["tenants"].values())
            # what is lent is borrowed: at each decision Σ lent = min(Σ borrowed, Σ idle share)
            ts = ep["tenants"].values()
            assert sum(t["lent"] for t in ts) <= sum(t["borrowed"] for t in ts) + 1e-9, (key, side)
        live, twin = rec["episode"]["tenants"], rec["simulated"]["tenants"]
        for name in CONTRACTS:  # the same requests, classified live on their send times: a lag moves few
            assert live[name]["contract_arrived"] > 0
            assert abs(live[name]["contract_arrived"] - twin[name]["contract_arrived"]) <= max(
                2, 0.1 * twin[name]["contract_arrived"]), (key, name, live[name], twin[name])
        # the gateway's classes, replayed through the contract's meter on the times it classified them
        seed, pol = key.split("/", 1)
        lines = [json.loads(x) for x in (work / f"{seed}-{pol}" / "live" / "requests.jsonl").read_text().splitlines()
                 if x.strip()]
        for name, given in CONTRACTS.items():
            mine = sorted((x for x in lines if x["tenant"] == name and x["contract_at"] is not None),
                          key=lambda x: x["contract_at"])
            # what it did not classify was no completion request (the load generator's GET /v1/models)
            assert all(x["path"] != "/v1/completions" for x in lines if x["tenant"] == name and x not in mine)
            flags = [x["in_contract"] for x in mine]
            replay = classify(Contract(**given), [x["contract_at"] for x in mine], [x["prompt_tokens"] for x in mine],
                              [x["output_tokens"] for x in mine])
            assert flags == replay.tolist(), (key, name)
            assert sum(flags) == live[name]["contract_arrived"]  # no warm-up: every logged request counts
    twin = data["runs"]["0/static"]["simulated"]["tenants"]  # the simulator's classes: the requests' alone
    assert any(0 < twin[n]["contract_arrived"] < twin[n]["arrived"] for n in CONTRACTS), twin
    for block in ("simulated", "results"):
        stats = data[block]
        if stats is None:  # a loaded machine may lose the repeat live: said why, never averaged in
            assert block == "results" and data["excluded"]
            continue
        for p in ("static", "aimd"):
            entry = stats["policies"][p]
            assert "contracts_met" in entry and "jain_share" in entry
            for name, given in CONTRACTS.items():
                assert entry["tenants"][name]["contract"] == given and "contract_attainment" in entry["tenants"][name]
        verdict = data["verdicts"][block]
        assert verdict["static"] is None and verdict["aimd"]["outcome"] in ("wins", "ties", "loses")
    if data["results"] is not None:
        assert "Jain" in res.output and "in contract" in res.output and "contracts_met" in res.output


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--scenario", "h200-live-small", "--policy", "static", "--policy", "static"], "policies must be distinct"),
        (["--scenario", "h200-live-small", "--policy", "no-such-policy"], "no-such-policy"),
        (["--scenario", "seed-paper", "--policy", "static"], "needs a token-engine scenario"),
        (["--scenario", "no-such-scenario", "--policy", "static"], "unknown scenario 'no-such-scenario'"),
        (["--scenario", "h200-live-small", "--policy", "static", "--warmup", "5"], "--warmup must be >= 0 and <"),
        (["--scenario", "h200-live-small", "--policy", "static", "--load", "0"], "--load must be > 0"),
    ],
)
def test_a_protocol_that_cannot_run_is_refused_before_any_run(tmp_path: Path, extra: list[str], needle: str) -> None:
    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["protocol", *extra, "--repeats", "1", "--duration", "5", "--out", str(out)])
    assert res.exit_code == 2 and needle in res.output, res.output
    assert not out.exists()


VLLM_URL = os.environ.get("ADMIT_VLLM_URL", "").rstrip("/").removesuffix("/v1")


@pytest.mark.vllm
@pytest.mark.timeout(600)
@pytest.mark.skipif(not VLLM_URL, reason="ADMIT_VLLM_URL is unset (make test starts a real vLLM server)")
def test_one_repeat_of_the_protocol_in_front_of_real_vllm(tmp_path: Path) -> None:
    """One short repeat, two policies, against scripts/vllm_server.sh's real vLLM engine, with the simulated
    twin: each run valid or left out with its reasons, the backend figures from vLLM's own /metrics, the twin
    over the repeat either way, the tables printed."""
    from admit.live.fidelity_real import SCENARIO

    out = tmp_path / "real.json"
    res = _cli("--backend", VLLM_URL, "--scenario", str(SCENARIO), "--policy", "static", "--policy", "aimd",
               "--repeats", "1", "--duration", "20", "--simulate", "--out", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["protocol"]["backend"] == VLLM_URL
    for rec in data["runs"].values():
        assert rec["valid"] == (not rec["invalid_reasons"])
        assert sum(t["completed"] for t in rec["episode"]["tenants"].values()) > 0
        backend = rec["backend"]
        assert backend["scrape_failures"] == 0 and backend["preemptions"] is not None  # vLLM's own counter
        assert 0.0 < backend["kv_usage_peak"] <= 1.0 and backend["backend_finished"] > 0
    assert data["simulated"]["seeds"] == 1 and list(data["simulated"]["policies"]) == ["static", "aimd"]
    if all(rec["valid"] for rec in data["runs"].values()):
        assert data["valid_repeats"] == [0] and list(data["results"]["policies"]) == ["static", "aimd"]
        assert "live against its simulated twin" in res.output
    else:  # a machine too loaded to keep the schedule: the repeat is left out and said so, never averaged in
        assert data["valid_repeats"] == [] and data["results"] is None and "excluded: seed 0" in res.output


def test_a_calibration_that_is_not_one_is_refused_before_any_run(tmp_path: Path) -> None:
    cal = tmp_path / "calibration.json"
    cal.write_text("{}")
    out = tmp_path / "p.json"
    for twin in ([], ["--simulate"]):
        res = CliRunner().invoke(app, ["protocol", "--scenario", "h200-live-small", "--policy", "static", "--repeats",
                                       "1", "--duration", "5", *twin, "--calibration", str(cal), "--out", str(out)])
        assert res.exit_code == 2 and "not an `admit calibrate` result" in res.output, res.output
        assert not out.exists()


CALIBRATION = Path(__file__).parents[2] / "docs" / "results" / "cpu-smollm2-avx512bf16-calibration.json"


def test_with_a_calibration_the_live_baseline_deploys_caps_tuned_on_that_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine of the committed cpu-smollm2 preset and a faster CPU's fit (a real `admit calibrate` result)
    get other tuned caps at 4 × the duo scenario's load; with --calibration the control loop of the live run
    deploys the fit's caps, found under the fit's own fingerprint, never the preset's."""
    from admit.agents.registry import make_controller
    from admit.engine.presets import overriding, preset_from_calibration
    from admit.envs.scenario import load_scenario
    from admit.live.fidelity_real import SCENARIO, scaled
    from admit.train.static_search import fingerprint

    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path / "cache"))  # the control loop's process reads it too
    sc = scaled(load_scenario(str(SCENARIO)), 4.0)
    fit = preset_from_calibration(json.loads(CALIBRATION.read_text()), "cpu-smollm2")
    def caps() -> list[int]:
        ctrl = make_controller("static:best", sc)
        ctrl.reset(sc.control_spec(), 0)  # where static:best finds (or tunes) its caps
        return list(ctrl.cap)

    committed_fp, committed = fingerprint(sc), caps()
    with overriding(fit):
        fitted_fp, fitted = fingerprint(sc), caps()
    assert fitted_fp != committed_fp and fitted != committed, (fitted, committed)
    out = tmp_path / "p.json"
    res = _cli("--scenario", str(SCENARIO), "--policy", "static:best", "--repeats", "1", "--duration", "5",
               "--load", "4", "--calibration", str(CALIBRATION), "--out", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["protocol"]["calibration"].startswith("sha256:")
    lim = sc.control_spec().limits  # the first decision moves each limit one step toward its cap

    def first(caps: list[int]) -> list[int]:
        return [lim.initial + max(-lim.max_step, min(lim.max_step, c - lim.initial)) for c in caps]

    assert first(fitted) != first(committed)  # so the run below tells them apart
    limits = data["runs"]["0/static:best"]["limits"]
    assert [limits[t.name][0] for t in sc.tenants] == first(fitted)

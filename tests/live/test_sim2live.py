"""sim2live's pieces that decide whether the comparison is fair: both sides get the same requests, the
live trace is what loadgen will replay, and the measured section survives `admit fidelity` regenerating
docs/fidelity.md."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from admit.engine.fidelity import SIM2LIVE_SECTION, kept_tail
from admit.envs.scenario import load_scenario
from admit.live.sim2live import (
    align_decisions,
    compare,
    nearest_rank,
    per_request_gap,
    replay_requests,
    simulate,
    write_section,
    write_trace,
)
from admit.loadgen.histogram import Histogram
from admit.loadgen.traces import read_trace


def test_the_trace_replays_exactly_the_simulated_requests(tmp_path: Path) -> None:
    sc = load_scenario("h200-live-small", horizon_s=30)
    reqs = replay_requests(sc, seed=3)
    assert reqs and all(0 <= r.arrival < 30 for r in reqs)
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)
    path = tmp_path / "requests.jsonl"
    write_trace(sc, reqs, path)
    for i, tc in enumerate(sc.tenants):
        mine = [r for r in reqs if r.tenant == i]
        assert mine[0].arrival == 0.0  # loadgen replays a tenant from its first request
        tr = read_trace(path, tc.name).window(sc.horizon_s)
        assert len(tr.arrivals) == len(mine)
        assert max(abs(a - r.arrival) for a, r in zip(tr.arrivals.tolist(), mine, strict=True)) < 1e-6
        assert tr.output_tokens.tolist() == [r.output_tokens for r in mine]
        assert tr.prompt_tokens.tolist() == [max(1, r.prompt_tokens - 1) for r in mine]  # + BOS = the drawn length
    assert all(json.loads(line)["tenant"] in {"chat", "agent"} for line in path.read_text().splitlines())


def test_the_simulator_runs_on_the_replayed_requests_and_drains() -> None:
    sc = load_scenario("h200-live-small", horizon_s=30)
    reqs = replay_requests(sc, seed=3)
    res = simulate(sc, reqs, "static", seed=3)
    assert sum(t["sent"] for t in res["tenants"].values()) == len(reqs)
    assert res["completed"] == len(reqs)  # drained: nothing dropped at this load, nothing left running
    assert res["e2e_p99_s"] >= res["e2e_p50_s"] > 0
    assert simulate(sc, reqs, "static", seed=3) == res  # the requests are not used up by a run
    # one logged decision per interval of the load, at t = 0, interval, ... (what the live log is matched with)
    assert [d["t"] for d in res["decisions"]] == [k * sc.interval_s for k in range(int(30 / sc.interval_s))]
    assert res["decisions"][0]["observation"]["tenants"]["chat"]["arrivals"] == 0  # t = 0: nothing arrived yet
    assert all(d["limits_after"] == {"chat": 4, "agent": 4} for d in res["decisions"])  # static holds


def test_live_decisions_are_matched_to_the_simulators_by_time_since_the_first_arrival() -> None:
    sim = [{"t": 2.0 * k, "limits_after": {"a": 4 + k}} for k in range(4)]
    live = [{"time": 100.0, "limits_after": {"a": 4}},  # before the load: the simulator's t = 0
            {"time": 101.5, "since_traffic_s": 2.004, "limits_after": {"a": 5}},
            {"time": 103.5, "since_traffic_s": 3.99, "limits_after": {"a": 5}},  # the simulator moved to 6 here
            {"time": 105.5, "outcome": "fetch-error"},  # decided nothing
            {"time": 107.5, "since_traffic_s": 8.01, "limits_after": {"a": 8}}]  # past the simulator's horizon
    got = align_decisions(sim, live, 2.0)
    assert [r["live"] for r in got["rows"]] == [{"a": 4}, {"a": 5}, {"a": 5}, None]
    assert (got["decisions"], got["same_limits"], got["first_difference_t"]) == (4, 2, 4.0)
    assert got["max_offset_s"] == 0.01 and got["rows"][0]["offset_s"] is None and got["max_limit_gap"] == 1


def test_repetitions_are_compared_by_their_median_with_the_spread_beside_it() -> None:
    sim = {"throughput_rps": 2.0, "e2e_p99_s": 1.0, "tenants": {"a": {"e2e_p99_s": 1.0}}}
    lives = [{"throughput_rps": 2.0, "e2e_p99_s": x, "tenants": {"a": {"e2e_p99_s": x}}} for x in (1.05, 1.3, 0.98)]
    got = compare(sim, lives)["all"]["e2e_p99_s"]
    assert (got["live"], got["live_min"], got["live_max"]) == (1.05, 0.98, 1.3)
    assert got["rel_diff"] == 0.05 and got["within"] and got["reps_within"] == 2 and got["rel_diffs"][1] == 0.3
    assert compare(sim, lives[1:2])["a"]["e2e_p99_s"]["within"] is False  # 10% is not loosened for one run


def test_the_section_survives_regeneration(tmp_path: Path) -> None:
    doc = tmp_path / "fidelity.md"
    doc.write_text("# Report\n\nold body\n")
    write_section(doc, f"{SIM2LIVE_SECTION}\n\n| a | b |\n")
    write_section(doc, f"{SIM2LIVE_SECTION}\n\n| c | d |\n")  # replaced, not appended twice
    text = doc.read_text()
    assert text.count(SIM2LIVE_SECTION) == 1 and "| c | d |" in text and text.startswith("# Report")
    regenerated = "# Report\n\nnew body\n" + kept_tail(doc)  # what `admit fidelity` writes
    assert "new body" in regenerated and regenerated.endswith(f"{SIM2LIVE_SECTION}\n\n| c | d |\n")
    # a section after it (the simulator against real vLLM) survives the sim-to-live section's regeneration
    doc.write_text(text + "\n## Simulator vs real vLLM\n\n| e |\n")
    write_section(doc, f"{SIM2LIVE_SECTION}\n\n| f |\n")
    text = doc.read_text()
    assert "| c | d |" not in text and "| f |" in text and text.endswith("## Simulator vs real vLLM\n\n| e |\n")
    assert text.index(SIM2LIVE_SECTION) < text.index("## Simulator vs real vLLM")


def test_per_request_gap_matches_the_same_requests_in_arrival_order(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    rows = [{"tenant": "a", "arrival": 10.5, "e2e_s": 1.25, "outcome": "ok", "path": "/v1/completions"},
            {"tenant": "a", "arrival": 10.0, "e2e_s": 2.0, "outcome": "ok", "path": "/v1/completions"},
            {"tenant": "a", "arrival": 9.0, "e2e_s": 0.01, "outcome": "ok", "path": "/v1/models"},  # not a request
            {"tenant": "b", "arrival": 10.2, "e2e_s": 0.5, "outcome": "ok", "path": "/v1/completions"}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"tenant": "b", "arr')  # a half-written line
    got = per_request_gap({"a": [1.5, 1.0], "b": [0.5, 0.7]}, log)
    assert got["a"] == {"matched": 2, "median_s": 0.375, "p90_s": 0.475, "max_s": 0.5}  # 2.0-1.5 and 1.25-1.0
    assert got["b"]["matched"] == 0 and "1 live requests for 2 simulated" in got["b"]["note"]


def test_the_simulators_percentiles_are_the_load_generators() -> None:
    """Both sides' p99 is the nearest-rank sample: of 185 requests the second slowest, not a blend with the third."""
    values = [0.5] * 182 + [2.2, 2.8, 3.6]  # a bursty tenant's tail: third, second slowest and slowest
    hist = Histogram()
    for v in values:
        hist.record(int(v * 1e9))
    assert nearest_rank(values, 99) == 2.8
    assert abs(hist.percentile(99) / 1e9 - 2.8) <= 0.008 * 2.8  # the loadgen's answer, within its bucket
    assert nearest_rank(values, 50) == 0.5 and nearest_rank([], 99) is None


def test_real_backend_loads_scale_rates_and_errors_are_against_the_real_figures(tmp_path: Path) -> None:
    from admit.envs.scenario import load_scenario
    from admit.live import fidelity_real as fr

    sc = load_scenario(str(fr.SCENARIO))
    assert sc.engine.preset == "cpu-smollm2"
    heavy = fr.scaled(sc, 1.6)
    assert [t.arrival.rate for t in heavy.tenants] == pytest.approx([1.6 * t.arrival.rate for t in sc.tenants])
    assert heavy.name.endswith("@1.6") and sc.tenants[0].arrival.rate == 0.5  # the original is untouched
    with pytest.raises(ValueError, match="must be > 0"):
        fr.scaled(sc, 0)
    burst = load_scenario("h200-live-small")  # its agent tenant is MMPP: both rates scale, the phases do not
    agent, twice = burst.tenants[1].arrival, fr.scaled(burst, 2.0).tenants[1].arrival
    assert (twice.rate_on, twice.rate_off) == (2 * agent.rate_on, 2 * agent.rate_off)
    assert (twice.mean_on_s, twice.mean_off_s) == (agent.mean_on_s, agent.mean_off_s)
    trace = load_scenario("h200-azure-2023")  # trace replay: its speed-up
    assert [t.arrival.speedup for t in fr.scaled(trace, 3.0).tenants] == [3 * t.arrival.speedup for t in trace.tenants]
    # (sim - real) / real, per scope; the summary's medians over the scopes
    one = {m: 1.0 for m in fr.METRICS}
    sim = {**one, "ttft_p50_s": 1.2, "tenants": {"a": {**one, "e2e_p99_s": 0.5}}}
    real = {**one, "tenants": {"a": {**one, "e2e_p99_s": None}}}
    errs = fr.errors(sim, real)
    assert errs["all"]["ttft_p50_s"]["error"] == 0.2 and errs["a"]["e2e_p99_s"]["error"] is None
    s = fr.summary(errs)
    assert s["central"]["figures"] == 6 and s["central"]["median_abs_error"] == 0.0 and s["central"]["met"]
    assert s["tails"]["figures"] == 5  # the missing real figure is left out, not counted as 0
    # the live load: numbered prompts and a cache salt of the run's own
    trace = tmp_path / "t.jsonl"
    a, b = fr.real_load_config(sc, trace), fr.real_load_config(sc, trace)
    assert a["unique_prompts"] is True
    salts = {t["extra"]["cache_salt"] for t in a["tenants"]}
    assert len(salts) == 1 and salts != {t["extra"]["cache_salt"] for t in b["tenants"]}


def test_utilisations_become_the_loads_the_preset_in_use_puts_there() -> None:
    """--utilisation: the same share of the engine's estimated capacity on a faster engine (its refitted preset
    is faster too) is a larger multiple of the scenario's rates."""
    from admit.engine.presets import get_preset, overriding
    from admit.engine.steptime import StepTimeModel
    from admit.envs.family import scenario_load
    from admit.envs.scenario import load_scenario
    from admit.live import fidelity_real as fr

    sc = load_scenario(str(fr.SCENARIO))
    loads = fr.loads_for(sc, [0.25, 1.05])
    for u, x in zip([0.25, 1.05], loads, strict=True):
        assert scenario_load(fr.scaled(sc, x)) == pytest.approx(u, rel=5e-3)  # loads of 3 digits
    p = get_preset("cpu-smollm2")
    fast = dataclasses.replace(p, step=StepTimeModel(**{k: v / 2 if k.endswith("_s") or "_s_" in k else v
                                                          for k, v in dataclasses.asdict(p.step).items()}))
    with overriding(fast):
        assert fr.loads_for(sc, [0.25])[0] > 1.5 * loads[0]
    with pytest.raises(ValueError, match="utilisation must be > 0"):
        fr.loads_for(sc, [0.5, 0.0])

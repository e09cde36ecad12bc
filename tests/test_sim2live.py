"""sim2live's pieces that decide whether the comparison is fair: both sides get the same requests, the
live trace is what loadgen will replay, and the measured section survives `admit fidelity` regenerating
docs/fidelity.md."""

from __future__ import annotations

import json
from pathlib import Path

from admit.envs.fidelity import SIM2LIVE_SECTION, kept_tail
from admit.envs.scenario import load_scenario
from admit.gateway.sim2live import replay_requests, simulate, write_section, write_trace
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


def test_the_section_survives_regeneration(tmp_path: Path) -> None:
    doc = tmp_path / "fidelity.md"
    doc.write_text("# Report\n\nold body\n")
    write_section(doc, f"{SIM2LIVE_SECTION}\n\n| a | b |\n")
    write_section(doc, f"{SIM2LIVE_SECTION}\n\n| c | d |\n")  # replaced, not appended twice
    text = doc.read_text()
    assert text.count(SIM2LIVE_SECTION) == 1 and "| c | d |" in text and text.startswith("# Report")
    regenerated = "# Report\n\nnew body\n" + kept_tail(doc)  # what `admit fidelity` writes
    assert "new body" in regenerated and regenerated.endswith(f"{SIM2LIVE_SECTION}\n\n| c | d |\n")

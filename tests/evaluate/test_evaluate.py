import json
import os
import re
import subprocess
import sys

import pytest
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import evaluate, paired_p, run_policy
from contract_helpers import without_contracts

# The published study's table (20 seeds × 1800 s) and the issue's tolerances.
STUDY = {
    "static": {"throughput_rps": 0.686, "p99_s": 11.75, "dropped": 1.9},
    "naive": {"throughput_rps": 0.515, "p99_s": 12.79, "dropped": 309.5},
    "differentiated": {"throughput_rps": 0.601, "p99_s": 13.25, "dropped": 154.7},
}


def test_common_random_numbers_same_requests_for_every_policy():
    sc = load_scenario("seed-paper")
    a = run_policy(sc, "static", 3)
    b = run_policy(sc, "naive", 3)
    c = run_policy(sc, "static", 3)
    assert a["arrived"] == b["arrived"]  # same workload on the same seed
    assert a == c  # and the same policy gives the same result


def test_paired_p_value():
    assert paired_p([1, 2, 3], [1, 2, 3]) == 1.0
    assert paired_p(list(range(20)), [x + 1 for x in range(20)]) < 1e-3


def test_reproduces_the_study_within_the_issues_tolerances():
    ev = evaluate("seed-paper", ["static", "naive", "differentiated"], seeds=20).to_json()
    got = {p: {m: ev["policies"][p][m]["mean"] for m in ("throughput_rps", "p99_s", "dropped")} for p in STUDY}
    for p, want in STUDY.items():
        assert got[p]["throughput_rps"] == pytest.approx(want["throughput_rps"], rel=0.10), p
        assert got[p]["p99_s"] == pytest.approx(want["p99_s"], rel=0.10), p
        if p == "static":
            assert got[p]["dropped"] < 10
        else:
            assert got[p]["dropped"] == pytest.approx(want["dropped"], rel=0.25), p
    # the same ordering as the study
    assert got["static"]["throughput_rps"] > got["differentiated"]["throughput_rps"] > got["naive"]["throughput_rps"]
    assert got["naive"]["dropped"] > got["differentiated"]["dropped"] > got["static"]["dropped"]
    assert ev["policies"]["naive"]["p_value_vs_first"]["throughput_rps"] < 0.05


def test_cli_writes_results_json_and_plot(tmp_path):
    out, plot = tmp_path / "r.json", tmp_path / "p.png"
    cmd = [
        sys.executable,
        "-m",
        "admit.cli",
        "evaluate",
        "--scenario",
        "seed-paper",
        "--policy",
        "static",
        "--policy",
        "naive",
        "--seeds",
        "3",
        "--out",
        str(out),
        "--plot",
        str(plot),
        "--workers",
        "2",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["scenario"] == "seed-paper" and data["seeds"] == 3
    for name in ("static", "naive"):
        e = data["policies"][name]
        for m in ("throughput_rps", "p99_s", "dropped"):
            assert set(e[m]) >= {"mean", "std", "ci95"}
            lo, hi = e[m]["ci95"]
            assert lo <= e[m]["mean"] <= hi
        assert "throughput_rps" in e["p_value_vs_first"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "static" in res.stdout and "naive" in res.stdout


def test_cli_bad_input_is_a_clear_error():
    res = subprocess.run(
        [sys.executable, "-m", "admit.cli", "evaluate", "--scenario", "seed-paper", "--policy", "nonsense"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "unknown policy 'nonsense'" in res.stderr and "static" in res.stderr


# ---------------------------------------------------------------------------------- admit results
def test_results_cover_seed_paper_and_every_token_scenario_and_say_why_a_policy_is_missing(monkeypatch):
    from admit.envs.scenario import bundled_scenarios
    from admit.evaluate import results

    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    # seed-paper (the study's reproduction) and every bundled token-engine scenario
    default = results.default_scenarios()
    assert default[0] == "seed-paper"
    assert {"h200-mixed", "h200-azure-2023", "servegen-skewed"} <= set(default)
    token = {s for s in bundled_scenarios() if load_scenario(s).engine.kind == "token"}
    assert set(default[1:]) == token
    # a shipped policy joins the scenario with its name, and only that one
    assert "ppo:seed-paper" in results.policies_for("seed-paper")
    everywhere = [p for p in results.policies_for("seed-paper") if p in ("ppo:general", "ppo:general-untuned")]
    general = [p for p in everywhere if p == "ppo:general"]
    assert [p for p in results.policies_for("no-such-scenario") if p.startswith("ppo:")] == everywhere
    assert not any("PPO" in n for n in results.skipped("seed-paper"))
    (ppo_note,) = [n for n in results.skipped("no-such-scenario") if "PPO" in n]
    assert "agents/pretrained/ppo-no-such-scenario does not exist" in ppo_note
    assert ("`ppo:general`, one policy for every scenario, is." in ppo_note) == bool(general)
    # without a model server the LLM policy is left out, and the note says how to include it
    assert not any(p.startswith("llm:") for p in results.policies_for("seed-paper"))
    assert any("ADMIT_LLM_URL` was unset" in n for n in results.skipped("seed-paper"))
    monkeypatch.setenv("ADMIT_LLM_URL", "http://127.0.0.1:9/v1")
    assert results.policies_for("seed-paper")[-1] == "llm:http://127.0.0.1:9/v1"
    assert not any(p.startswith("llm:") for p in results.policies_for("h200-mixed"))
    # the report's header names the command that regenerates it, settings that differ from the defaults included
    four = "--scenario seed-paper --scenario h200-mixed --scenario h200-azure-2023 --scenario servegen-skewed"
    want = f"scripts/llm_server.sh run admit results --seeds 20 {four} --workers 2"
    monkeypatch.delenv("ADMIT_LLM_TIMEOUT_S", raising=False)
    monkeypatch.setenv("ADMIT_LLM_EVERY", "100")
    named = ["seed-paper", "h200-mixed", "h200-azure-2023", "servegen-skewed"]
    assert results.command(20, named, 2, results.DEFAULT_OUT) == want
    monkeypatch.setenv("ADMIT_LLM_EVERY", "50")
    assert results.command(20, named, 2, results.DEFAULT_OUT) == f"ADMIT_LLM_EVERY=50 {want}"


def test_results_report_with_the_llm_policy_on_seed_paper(monkeypatch, tmp_path):
    """The whole report path with a real OpenAI-compatible server (scripted: it always answers 'hold')."""
    from admit.evaluate import results
    from llm_scripted_server import ScriptedServer, reply

    monkeypatch.setattr(results, "HAND_POLICIES", ("static", "naive"))  # keep the test fast
    monkeypatch.setattr(results, "ABLATIONS", ())
    monkeypatch.setattr(results, "baseline", lambda scenario: ("static", None))  # and no tuning of static:best
    monkeypatch.delenv("ADMIT_LLM_LOG", raising=False)
    monkeypatch.delenv("ADMIT_LLM_EVERY", raising=False)
    monkeypatch.delenv("ADMIT_LLM_TIMEOUT_S", raising=False)
    monkeypatch.setenv("ADMIT_LLM_MODEL", "scripted-model")
    out = tmp_path / "docs" / "RESULTS.md"
    with ScriptedServer(default=reply([0, 0], "hold")) as server:
        monkeypatch.setenv("ADMIT_LLM_URL", server.base_url)
        text = results.build(2, ["seed-paper"], 1, out)
        n_requests = len(server.requests)
    assert out.read_text() == text
    for var in ("ADMIT_LLM_LOG", "ADMIT_LLM_EVERY", "ADMIT_LLM_TIMEOUT_S"):
        assert var not in os.environ, var  # put back after the run
    cmd = f"scripts/llm_server.sh run admit results --seeds 2 --scenario seed-paper --workers 1 --out {out}"
    assert f"Regenerated by `{cmd}`" in text
    data = json.loads((out.parent / "results" / "seed-paper.json").read_text())
    assert list(data["policies"]) == ["static", "naive", "ppo:seed-paper", "ppo:general", "ppo:general-untuned",
                                      f"llm:{server.base_url}"]
    llm = data["policies"][f"llm:{server.base_url}"]
    # a policy that is always told to hold serves exactly what static serves, seed by seed
    assert llm["throughput_rps"]["values"] == data["policies"]["static"]["throughput_rps"]["values"]
    assert "| llm (scripted-model) |" in text
    assert "asks the model every 100 decisions (timeout 60 s)" in text
    calls, valid = map(int, re.search(r"(\d+) model calls, (\d+) valid replies", text).groups())
    assert calls == valid == n_requests > 0
    assert (out.parent / "results" / "seed-paper.png").read_bytes()[:4] == b"\x89PNG"


def _entry(tput: float, p99: float, drops: float, p_t: float = 1.0, p_p99: float = 1.0, p_d: float = 1.0) -> dict:
    return {
        "throughput_rps": {"mean": tput},
        "p99_s": {"mean": p99},
        "dropped": {"mean": drops},
        "p_value_vs_first": {"throughput_rps": p_t, "p99_s": p_p99, "dropped": p_d},
    }


def test_weak_reading_sits_beside_the_strict_verdict_and_is_weaker():
    from admit.evaluate.results import non_inferior
    from admit.evaluate.results import pareto_verdict as verdict

    static = _entry(6.158, 38.4, 4.5)
    # Lower p99 at p < 0.05, a throughput a hair lower and fewer drops, neither significant: the strict
    # verdict fails on both, the weak reading holds.
    robust = _entry(6.1578, 35.6, 0.8, p_t=0.49, p_p99=4.8e-4, p_d=0.98)
    assert verdict(robust, static).startswith("no (throughput") and "drops" in verdict(robust, static)
    assert non_inferior(robust, static) == "yes"
    # Significantly lower throughput, a p99 that is lower but not significantly, or more than half of
    # static's drops each fail the weak reading too.
    assert non_inferior(_entry(6.0, 35.6, 0.8, p_t=0.01, p_p99=1e-4), static) == "no (throughput)"
    assert non_inferior(_entry(6.158, 35.6, 0.8, p_p99=0.2), static) == "no (p99)"
    assert non_inferior(_entry(6.158, 35.6, 3.0, p_p99=1e-4, p_d=0.3), static) == "no (drops)"
    # Both without drops is fine; a policy that drops where static never does is not.
    zero = _entry(7.829, 16.0, 0.0)
    assert non_inferior(_entry(7.829, 15.3, 0.0, p_p99=1e-5), zero) == "yes"
    assert non_inferior(_entry(7.829, 15.3, 2.0, p_p99=1e-5, p_d=0.2), zero) == "no (drops)"


# ---------------------------------------------------------------------------------- goodput, per tenant
SHORT_S = 120.0  # simulated seconds per episode: enough for every h200-mixed tenant to be served and to miss


@pytest.fixture(scope="module")
def short_eval() -> dict:
    """Three policies on h200-mixed cut to two minutes, three seeds: every figure the reports read (without the
    scenario's contracts: tests/envs/test_contracts.py and the contract tests below take those)."""
    return evaluate(without_contracts("h200-mixed", horizon_s=SHORT_S), ["static", "robust", "static:16"],
                    seeds=3).to_json()


def test_rollout_counts_every_tenant_and_the_tenants_add_up_to_the_total():
    sc = load_scenario("h200-mixed", horizon_s=SHORT_S)
    r = run_policy(sc, "static", 1)
    tenants = r["tenants"]
    assert list(tenants) == [t.name for t in sc.tenants]
    assert sum(t["good"] for t in tenants.values()) == pytest.approx(r["goodput_rps"] * SHORT_S)
    for m in ("arrived", "completed", "timeouts", "rejected"):
        assert sum(t[m] for t in tenants.values()) == pytest.approx(r[m]), m
    assert r["worst_attainment"] == min(t["attainment"] for t in tenants.values())
    assert 0 < r["goodput_rps"] <= r["throughput_rps"]  # a good request is a completed one
    assert r["e2e_p99_s"] == r["p99_s"] and r["e2e_p50_s"] == r["p50_s"]  # one figure under both names


def test_results_json_has_the_goodput_metrics_and_every_tenant_with_paired_tests(short_eval):
    from admit.evaluate.offline import METRICS, TENANT_METRICS

    data = short_eval
    assert data["horizon_s"] == SHORT_S and data["baseline"] == "static"
    names = ["chat", "batch", "agent"]
    for pol, e in data["policies"].items():
        assert next(iter(e)) == "goodput_rps"  # goodput leads
        for m in (*METRICS, "mean_limit"):
            assert set(e[m]) == {"mean", "std", "ci95", "values"} and len(e[m]["values"]) == 3, (pol, m)
        assert set(e["p_value_vs_first"]) >= {"goodput_rps", "attainment", "worst_attainment", "ttft_p99_s"}
        assert list(e["tenants"]) == names
        for t in e["tenants"].values():
            for m in TENANT_METRICS:
                assert set(t[m]) == {"mean", "std", "ci95", "values"}, m
            assert set(t["p_value_vs_first"]) == set(TENANT_METRICS)
            assert all(0.0 <= a <= 1.0 for a in t["attainment"]["values"])
        # seed by seed, the tenants' good requests and goodput are the overall ones
        for i in range(3):
            good = sum(e["tenants"][n]["good"]["values"][i] for n in names)
            assert good == pytest.approx(e["goodput_rps"]["values"][i] * SHORT_S)
            tg = sum(e["tenants"][n]["goodput_rps"]["values"][i] for n in names)
            assert tg == pytest.approx(e["goodput_rps"]["values"][i])
            arrived = sum(e["tenants"][n]["arrived"]["values"][i] for n in names)
            assert good / arrived == pytest.approx(e["attainment"]["values"][i])
            worst = min(e["tenants"][n]["attainment"]["values"][i] for n in names)
            assert worst == pytest.approx(e["worst_attainment"]["values"][i])
    base = data["policies"]["static"]
    assert all(p == 1.0 for p in base["p_value_vs_first"].values())
    assert all(p == 1.0 for t in base["tenants"].values() for p in t["p_value_vs_first"].values())
    # the per-tenant test is the overall one, on the tenant's values
    s16 = data["policies"]["static:16"]["tenants"]["chat"]
    assert s16["p_value_vs_first"]["attainment"] == paired_p(
        s16["attainment"]["values"], base["tenants"]["chat"]["attainment"]["values"]
    )


def _judged(goodput: float, p_goodput: float, attain: dict[str, tuple[float, float]]) -> dict:
    """A results.json policy entry with what the verdict reads: goodput and each tenant's (attainment, p)."""
    return {
        "goodput_rps": {"mean": goodput},
        "p_value_vs_first": {"goodput_rps": p_goodput},
        "tenants": {
            n: {"attainment": {"mean": a}, "p_value_vs_first": {"attainment": p}} for n, (a, p) in attain.items()
        },
    }


def test_verdict_wins_ties_and_loses_by_the_rule():
    from admit.evaluate.verdict import verdict, verdicts

    base = _judged(5.0, 1.0, {"chat": (0.80, 1.0), "batch": (0.95, 1.0)})
    # more goodput at p < 0.05, every tenant within a point or better: a win
    win = verdict(_judged(5.4, 0.002, {"chat": (0.86, 0.001), "batch": (0.945, 0.001)}), base)
    assert win.outcome == "wins" and win.reasons == ("goodput +0.400 req/s, p = 0.002",)
    # the same goodput gain bought by dropping one tenant by more than a point, significantly: a loss naming it
    loss = verdict(_judged(5.4, 0.002, {"chat": (0.86, 0.001), "batch": (0.93, 0.01)}), base)
    assert loss.outcome == "loses" and loss.reasons[1:] == ("batch attainment -0.020, p = 0.010",)
    assert str(loss) == "loses: goodput +0.400 req/s, p = 0.002; batch attainment -0.020, p = 0.010"
    # a tenant lower by more than a point without significance does not lose it (but is named)
    loose = verdict(_judged(5.4, 0.002, {"chat": (0.86, 0.001), "batch": (0.90, 0.2)}), base)
    assert loose.outcome == "wins" and "batch attainment -0.050, p = 0.200 (not significant)" in loose.reasons
    # higher goodput that is not significant: a tie
    tie = verdict(_judged(5.2, 0.08, {"chat": (0.82, 0.08), "batch": (0.95, 1.0)}), base)
    assert tie.outcome == "ties" and tie.reasons == ("goodput +0.200 req/s, p = 0.080 (not significant)",)
    # identical on every seed: a tie that says so
    same = verdict(_judged(5.0, 1.0, {"chat": (0.80, 1.0), "batch": (0.95, 1.0)}), base)
    assert str(same) == "ties: goodput the same on every seed"
    # significantly less goodput: a loss, whatever the tenants
    assert verdict(_judged(4.5, 0.01, {"chat": (0.80, 1.0), "batch": (0.95, 1.0)}), base).outcome == "loses"
    # the boundary: exactly one point lower, significant, is not "more than one point"
    edge = verdict(_judged(5.4, 0.002, {"chat": (0.80, 1.0), "batch": (0.94, 0.001)}), base)
    assert edge.outcome == "wins"
    # with fewer than six seeds nothing can be significant, and the reports say so
    from admit.evaluate.verdict import MIN_SEEDS, too_few_seeds

    assert paired_p([1.0] * MIN_SEEDS, [0.0] * MIN_SEEDS) < 0.05 <= paired_p([1.0] * 5, [0.0] * 5)
    assert too_few_seeds(MIN_SEEDS) is None and "every verdict here is a tie" in too_few_seeds(3)
    # verdicts(): every policy against the first of a results.json
    data = {"policies": {"static": base, "x": _judged(5.4, 0.002, {"chat": (0.86, 0.001), "batch": (0.93, 0.01)})}}
    got = verdicts(data)
    assert got["static"] is None and got["x"] == loss


def test_table_leads_with_goodput_has_a_per_tenant_block_and_fits_120_columns(short_eval):
    from admit.evaluate.report import print_table
    from rich.console import Console

    console = Console(record=True, width=120)
    print_table(short_eval, console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 120
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("policy"))
    upper, lower = lines[head - 1], lines[head]  # the column headers take two lines
    words = ("goodput", "attainment", "worst", "Jain", "TTFT", "TPOT", "drops", "rejects", "limit")
    columns = [max(upper.find(w), lower.find(w)) for w in words]
    assert min(columns) > 0 and columns == sorted(columns)  # goodput first, then in the issue's order
    # the per-tenant block names every tenant, each on the row of the first policy
    for tenant in ("chat", "batch", "agent"):
        assert any(line.split()[:2] == [tenant, "static"] for line in lines if line.strip()), tenant
    # and the verdicts against the first policy, with their reasons
    assert "verdict vs static" in text
    assert re.search(r"^ robust\s+(wins|ties|loses)\s+goodput [+-]\d", text, re.M)


def test_pareto_plot_of_goodput_vs_worst_tenant_attainment_is_written(short_eval, tmp_path):
    from admit.evaluate.report import latency_pareto_plot, pareto_plot

    pareto_plot(short_eval, tmp_path / "sub" / "g.png")
    latency_pareto_plot(short_eval, tmp_path / "l.png")
    assert (tmp_path / "sub" / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "l.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_put_static_best_first_where_the_registry_makes_it(monkeypatch):
    from admit.agents.registry import make_controller
    from admit.controllers.static import StaticController
    from admit.evaluate import results

    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "HAND_POLICIES", ("static", "naive", "robust"))
    monkeypatch.setattr(results, "ABLATIONS", ())
    # tenants without contracts (with them static:contract leads: tests/evaluate/test_results_contracts.py)
    monkeypatch.setattr(results, "contracted", lambda scenario: False)
    # today (no static:best in the registry): plain static is the baseline and the note says why
    try:
        make_controller("static:best")
        has_best = True
    except ValueError:
        has_best = False
    if not has_best:
        assert results.policies_for("h200-mixed") == ["static", "naive", "robust", "ppo:h200-mixed", "ppo:general",
                                                      "ppo:general-untuned"]
        (note,) = [n for n in results.skipped("h200-mixed") if "static:best" in n]
        assert "the baseline is plain `static`" in note.lower()

    # once the registry makes it: static:best, then plain static, then the rest
    def fake(name: str, scenario=None):
        return StaticController(32) if name == "static:best" else make_controller(name, scenario)

    monkeypatch.setattr(results, "make_controller", fake)
    want = ["static:best", "static", "naive", "robust", "ppo:h200-mixed", "ppo:general", "ppo:general-untuned"]
    assert results.policies_for("h200-mixed") == want
    assert results.baseline("h200-mixed") == ("static:best", None)
    assert not any("static:best" in n for n in results.skipped("h200-mixed"))

    # a static:best that cannot run on a scenario (say, no caps tuned for it) falls back, saying why
    class Untuned(StaticController):
        def reset(self, spec, seed=None):
            raise LookupError("no tuned caps for this scenario")

    monkeypatch.setattr(results, "make_controller", lambda name, scenario=None: Untuned() if name == "static:best"
                        else None)
    base, why = results.baseline("h200-mixed")
    assert base == "static" and "no tuned caps" in why


def test_results_report_on_any_scenario_load_scenario_accepts(monkeypatch, tmp_path):
    """An extra scenario by path (a family instance FAMILY@SEED goes the same way): JSON, plot and section."""
    from importlib import resources

    import yaml
    from admit.envs.scenario import ScenarioError
    from admit.evaluate import results

    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "HAND_POLICIES", ("static", "static:16", "robust"))
    monkeypatch.setattr(results, "baseline", lambda scenario: ("static", None))  # no tuning of static:best here
    monkeypatch.setattr(results, "learned_policies", lambda scenario: [])  # the report's mechanics, quickly

    raw = yaml.safe_load(resources.files("admit.envs").joinpath("scenarios", "h200-mixed.yaml").read_text())
    for t in raw["tenants"]:  # the goodput layout (the contract one: tests/evaluate/test_report_lending.py)
        del t["contract"]
    path = tmp_path / "mixed-short.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "mixed-short", "horizon_s": 60}))
    out = tmp_path / "docs" / "RESULTS.md"
    with pytest.raises(ScenarioError):  # a bad name fails before any work
        results.build(2, [str(path), "no-such-scenario"], 1, out)
    assert not out.exists()
    text = results.build(2, [str(path)], 1, out)
    res = out.parent / "results"
    data = json.loads((res / "mixed-short.json").read_text())
    assert list(data["policies"]) == ["static", "static:16", "robust"]
    assert (res / "mixed-short.png").read_bytes()[:4] == b"\x89PNG"
    assert not (res / "mixed-short-p99.png").exists()  # the seed study's plot is seed-paper's alone
    assert f"## {path}" in text
    assert "| policy | goodput req/s | p | attainment |" in text  # goodput leads the table
    assert "| policy | chat | batch | agent |" in text  # per-tenant columns
    assert "Pareto vs static" not in text  # the p99 verdict is the seed-paper reproduction's only
    assert "no tenant's attainment is lower by more than one point" in text  # the rule, in the header
    assert re.search(r"\| (\*\*(wins|ties|loses)\*\*) \| goodput [+-]", text)
    # the summary row: the baseline's goodput, the verdict counts, the best adaptive policy (robust: the only one)
    row = next(line for line in text.splitlines() if line.startswith(f"| {path} | `static` "))
    g = data["policies"]["robust"]["goodput_rps"]["mean"] / data["policies"]["static"]["goodput_rps"]["mean"]
    assert "`robust` " in row and f"({g:.3f}×)" in row
    assert data["wall_s"] > 0 and re.search(rf"{re.escape(str(path))} \d+ s \(3 policies\)", text)
    # the report again from the JSON, nothing run: the same text (the date aside)
    (res / "mixed-short.png").unlink()
    monkeypatch.setattr(results, "evaluate", None)  # would fail if called
    again = results.build(2, [str(path)], 1, out, render_only=True)
    note = re.search(r", re-rendered by `[^`]*--render-only`", again)
    assert note is not None and again.replace(note.group(0), "") == text and (res / "mixed-short.png").exists()
    with pytest.raises(ValueError, match="has 2 seeds, not the 3"):
        results.build(3, [str(path)], 1, out, render_only=True)


def test_results_rerun_replaces_only_the_named_rows_and_refuses_a_changed_world(monkeypatch, tmp_path):
    """--rerun: the named policies and the baseline run again; the other rows are the earlier run's, kept only
    when the baseline gives its stored figures seed by seed."""
    import yaml
    from admit.evaluate import offline, results

    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "HAND_POLICIES", ("static", "static:16", "robust"))
    monkeypatch.setattr(results, "baseline", lambda scenario: ("static", None))
    monkeypatch.setattr(results, "learned_policies", lambda scenario: [])
    monkeypatch.setattr(results, "CONTRACT_POLICIES", ())  # nor the contract baselines, where it has contracts
    sc = load_scenario("h200-mixed").model_dump(mode="json")
    path = tmp_path / "mixed-short.yaml"
    path.write_text(yaml.safe_dump({**sc, "name": "mixed-short", "horizon_s": 40}))
    out = tmp_path / "docs" / "RESULTS.md"
    with pytest.raises(ValueError, match="does not exist"):  # nothing to keep yet
        results.build(2, [str(path)], 1, out, rerun=["robust"])
    results.build(2, [str(path)], 1, out)
    res = out.parent / "results" / "mixed-short.json"
    before = json.loads(res.read_text())
    before["policies"]["static:16"]["goodput_rps"]["mean"] = -1.0  # a marker: this row must be kept as it is
    res.write_text(json.dumps(before))
    ran: list[list[str]] = []
    real = offline.evaluate

    def spy(scenario, policies, *a, **k):
        ran.append(list(policies))
        return real(scenario, policies, *a, **k)

    monkeypatch.setattr(results, "evaluate", spy)
    text = results.build(2, [str(path)], 1, out, rerun=["robust"])
    assert ran == [["static", "robust"]]  # the baseline and the named policy, nothing else
    after = json.loads(res.read_text())
    assert list(after["policies"]) == ["static", "static:16", "robust"]
    assert after["policies"]["static:16"]["goodput_rps"]["mean"] == -1.0
    assert after["policies"]["robust"] == before["policies"]["robust"]  # deterministic: the same figures again
    assert [r["policies"] for r in after["reruns"]] == [["robust"]]
    assert "--rerun robust`" in text and "robust re-run " in text
    monkeypatch.setattr(results, "evaluate", None)  # a re-rendering runs nothing and still names the re-run
    rendered = results.build(2, [str(path)], 1, out, render_only=True)
    assert "--rerun robust`, re-rendered by `" in rendered
    monkeypatch.setattr(results, "evaluate", spy)
    assert results.rerun_matches("ppo:h200-mixed", ["ppo:"]) and not results.rerun_matches("ppo", ["ppo:"])
    # a world that changed since (here: the stored baseline figures differ) keeps nothing
    after["policies"]["static"]["goodput_rps"]["values"][0] += 1.0
    res.write_text(json.dumps(after))
    with pytest.raises(ValueError, match="no longer gives the stored figures .*goodput_rps"):
        results.build(2, [str(path)], 1, out, rerun=["robust"])
    assert json.loads(res.read_text()) == after  # and writes nothing
    with pytest.raises(ValueError, match="choose one"):
        results.build(2, [str(path)], 1, out, rerun=["robust"], render_only=True)


def test_cli_evaluate_on_a_shorter_horizon_and_results_refuse_an_unknown_scenario(tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "admit.cli", "evaluate", "--scenario", "h200-mixed", "--policy", "static"]
    cmd += ["--policy", "static:16", "--seeds", "2", "--horizon-s", "60", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["horizon_s"] == 60 and list(data["policies"]["static:16"]["tenants"]) == ["chat", "batch", "agent"]
    assert "h200-mixed (60 s episodes), 2 seeds" in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 120
    assert "every verdict here is a tie" in res.stdout.replace("\n", " ")
    bad = [sys.executable, "-m", "admit.cli", "results", "--seeds", "2", "--extra-scenario", "no-such-scenario"]
    bad += ["--out", str(tmp_path / "RESULTS.md")]
    res = subprocess.run(bad, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "unknown scenario 'no-such-scenario'" in res.stderr
    assert not (tmp_path / "RESULTS.md").exists()


def test_verdict_against_any_policy_is_the_verdict_with_that_policy_first():
    """The ppo:general section's verdicts against another policy are what a run with that policy as the
    baseline gives (p-values recomputed from the stored per-seed figures), and its counts follow them."""
    from admit.evaluate.results import general_row, general_section, hand_written, verdict_against
    from admit.evaluate.verdict import verdicts

    sc = load_scenario("h200-mixed", horizon_s=SHORT_S)
    pols = ["static", "robust", "static:2", "ppo:general"]
    a = evaluate(sc, pols, seeds=6).to_json()
    b = evaluate(sc, ["robust", "static", "static:2", "ppo:general"], seeds=6).to_json()
    got = {p: verdict_against(a, p, "robust") for p in ("static", "static:2", "ppo:general")}
    assert got == {p: verdicts(b)[p] for p in got}
    assert {v.outcome for v in got.values()} != {"ties"}  # six seeds tell caps of 2 apart
    assert hand_written(a) == ["robust"]
    row = general_row("h200-mixed", a)
    assert row is not None
    text, wins, no_worse = row
    assert "`robust`" in text and f"**{got['ppo:general'].outcome}**" in text
    assert wins == (verdicts(a)["ppo:general"].outcome == "wins")
    assert no_worse == (got["ppo:general"].outcome != "loses")
    section = "\n".join(general_section({"ppo:general": [row]}, "### Why\n\nmeasured reasons"))
    assert f"on **{int(wins)} of 1** tables" in section and f"on **{int(no_worse)} of 1**." in section
    assert "### `ppo:general`" in section and "ppo:general-untuned" not in section  # only the policies that ran
    assert section.endswith("measured reasons\n")
    assert general_row("h200-mixed", {"policies": {p: a["policies"][p] for p in pols[:3]}}) is None


# ---------------------------------------------------------------------------------- contracts
CONTRACT_SEEDS = 8  # enough pairs for p < 0.05 when every seed agrees


def _contract_eval(rows: dict[str, tuple[list[float], list[float], list[float]]], promise: float = 0.9) -> dict:
    """results.json of constructed per-seed figures: per policy (goodput, chat's in-contract attainment, batch's
    attainment) on each seed; chat has a contract promising ``promise``, batch none. Summarised and tested by
    evaluate/offline.py as a real evaluation is."""
    from admit.evaluate.offline import Evaluation

    per_seed = {
        p: [{"goodput_rps": g, "tenants": {"chat": {"attainment": c, "contract_attainment": c},
                                           "batch": {"attainment": b}}}
            for g, c, b in zip(*cols, strict=True)]
        for p, cols in rows.items()
    }
    contract = {"requests_per_s": 2.0, "burst": 4, "attainment": promise}
    return Evaluation("constructed", list(range(CONTRACT_SEEDS)), list(rows), per_seed, metrics=("goodput_rps",),
                      tenant_metrics=("attainment",), contracts={"chat": contract}).to_json()


def _seeds(mean: float, step: float = 0.001) -> list[float]:
    """Eight values around ``mean``, different on every seed (so a shifted copy differs on each, one sign)."""
    return [mean + step * (i - (CONTRACT_SEEDS - 1) / 2) for i in range(CONTRACT_SEEDS)]


def test_contract_verdict_wins_ties_and_loses_by_the_promises_kept():
    from admit.evaluate.verdict import contracts_met, has_contracts, verdicts

    base = (_seeds(5.0), _seeds(0.93), _seeds(0.8))
    data = _contract_eval({
        "base": base,
        # more goodput, chat still above its promise: a win, even though batch (no contract) is shed
        "win": (_seeds(5.5), _seeds(0.92), _seeds(0.1)),
        # more goodput bought with chat's contract, significantly below the baseline's attainment: a loss
        "broke": (_seeds(6.0), _seeds(0.85), _seeds(0.8)),
        # chat's mean just under the promise but not significantly below the baseline's: no loss, no win
        "missed": (_seeds(5.5), [0.94, 0.85] * 4, _seeds(0.8)),
        # less goodput, every contract kept: a loss on goodput
        "slower": (_seeds(4.5), _seeds(0.95), _seeds(0.8)),
        # the same goodput: a tie
        "same": base,
    })
    assert has_contracts(data)
    assert [contracts_met(data["policies"][p]) for p in ("base", "broke", "missed")] == [(1, 1), (0, 1), (0, 1)]
    v = verdicts(data)
    assert v["base"] is None
    assert v["win"] is not None and v["win"].outcome == "wins"
    assert v["win"].reasons == ("goodput +0.500 req/s, p = 0.008",)
    assert v["broke"] is not None and v["broke"].outcome == "loses"
    assert v["broke"].reasons == ("goodput +1.000 req/s, p = 0.008",
                                  "chat's contract broken: in-contract attainment 0.850 < 0.9 (baseline 0.930), "
                                  "p = 0.008")
    assert v["missed"] is not None and v["missed"].outcome == "ties"
    assert "chat's contract missed" in v["missed"].reasons[1] and "(not significant)" in v["missed"].reasons[1]
    assert v["slower"] is not None and v["slower"].outcome == "loses"
    assert v["slower"].reasons == ("goodput -0.500 req/s, p = 0.008",)
    assert str(v["same"]) == "ties: goodput the same on every seed"
    # a baseline that misses the promise cannot have it broken; a policy that keeps it is told so
    data = _contract_eval({"base": (_seeds(5.0), _seeds(0.80), _seeds(0.8)),
                           "keeps": (_seeds(4.9), _seeds(0.95), _seeds(0.8)),
                           "worse": (_seeds(5.2), _seeds(0.70), _seeds(0.8)),
                           "better": (_seeds(5.2), _seeds(0.85), _seeds(0.8)),
                           "noisy": (_seeds(5.2), [0.70, 0.89] * 4, _seeds(0.8))})
    v = verdicts(data)
    assert v["keeps"] is not None and v["keeps"].outcome == "loses"  # less goodput, still
    assert v["keeps"].reasons[1] == "chat's contract kept: in-contract attainment 0.950 ≥ 0.9 (baseline 0.800)"
    # broken by both: no loss, but a policy significantly lower than the baseline is told so
    assert v["worse"] is not None and v["worse"].outcome == "wins"
    assert v["worse"].reasons == ("goodput +0.200 req/s, p = 0.008",
                                  "chat's contract broken by both, lower: in-contract attainment 0.700 < baseline "
                                  "0.800 (promise 0.9), p = 0.008")
    # broken by both, the policy higher, or lower without significance: nothing said of the contract
    for p in ("better", "noisy"):
        vp = verdicts(data)[p]
        assert vp is not None and vp.outcome == "wins" and vp.reasons == ("goodput +0.200 req/s, p = 0.008",), p
    assert data["policies"]["noisy"]["tenants"]["chat"]["p_value_vs_first"]["contract_attainment"] >= 0.05
    # a loss on goodput lists it after the goodput change, the verdict still the goodput's
    data = _contract_eval({"base": (_seeds(5.0), _seeds(0.80), _seeds(0.8)),
                           "both": (_seeds(4.8), _seeds(0.70), _seeds(0.8))})
    vb = verdicts(data)["both"]
    assert vb is not None and vb.outcome == "loses"
    assert vb.reasons[0] == "goodput -0.200 req/s, p = 0.008" and vb.reasons[1].startswith(
        "chat's contract broken by both, lower: in-contract attainment 0.700 < baseline 0.800")
    # exactly the promise is met
    data = _contract_eval({"base": (_seeds(5.0), [0.9] * 8, _seeds(0.8)), "x": (_seeds(5.5), [0.9] * 8, _seeds(0.8))})
    assert contracts_met(data["policies"]["x"]) == (1, 1) and str(verdicts(data)["x"]).startswith("wins")


def test_without_contracts_the_verdict_is_the_attainment_rule():
    from admit.evaluate.verdict import has_contracts, verdict

    base = _judged(5.0, 1.0, {"chat": (0.80, 1.0), "batch": (0.95, 1.0)})
    assert not has_contracts({"policies": {"static": base}})
    # shedding batch with more goodput loses by the attainment rule, where there are no contracts
    assert verdict(_judged(5.4, 0.002, {"chat": (0.86, 0.001), "batch": (0.5, 0.001)}), base).outcome == "loses"


TIGHT = {"chat": {"requests_per_s": 1.5, "burst": 5, "attainment": 0.95},
         "agent": {"tokens_per_s": 6000, "burst": 20000, "attainment": 0.9}}


@pytest.fixture(scope="module")
def contract_eval() -> dict:
    """h200-live-small with a contract on each tenant that one slot per tenant (static:1) breaks and sixteen
    (static:16) keep, six seeds (the fewest at which a paired test can decide)."""
    from admit.envs.scenario import parse_scenario

    data = load_scenario("h200-live-small").model_dump(exclude_none=True)
    for t in data["tenants"]:
        t["contract"] = TIGHT[t["name"]]
    sc = parse_scenario(data, "h200-live-small with contracts")
    return evaluate(sc, ["static:16", "static:1"], seeds=6).to_json()


def test_an_evaluation_with_contracts_reports_the_promises_and_judges_by_them(contract_eval, tmp_path):
    from admit.evaluate.offline import CONTRACT_METRICS
    from admit.evaluate.report import pareto_plot, print_table
    from admit.evaluate.verdict import contracts_met, verdicts
    from rich.console import Console

    data = contract_eval
    base, one = data["policies"]["static:16"], data["policies"]["static:1"]
    for m in CONTRACT_METRICS:
        assert len(one[m]["values"]) == 6, m
    assert contracts_met(base) == (2, 2) and contracts_met(one) == (0, 2)
    assert 0 < one["jain_share"]["mean"] <= 1 and base["jain_share"]["mean"] > one["jain_share"]["mean"]
    v = verdicts(data)["static:1"]
    assert v is not None and v.outcome == "loses"
    assert any(r.startswith("chat's contract broken") for r in v.reasons)

    console = Console(record=True, width=120)
    print_table(data, console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 120
    # the overall table leads with the contracts met and the shortfall, then goodput, then Jain over shares
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("policy"))
    upper, lower = lines[head - 1], lines[head]
    columns = [max(upper.find(w), lower.find(w)) for w in ("met", "shortfall", "goodput", "share", "attainment")]
    assert min(columns) > 0 and columns == sorted(columns)
    assert re.search(r"^ static:16\s+2/2\s", text, re.M) and re.search(r"^ static:1\s+0/2\s", text, re.M)
    # per tenant: the in-contract attainment, the promise and whether it is met
    assert "in contract" in text and re.search(r"^ chat\s+static:16 .* 0\.95\s+yes ", text, re.M)
    assert re.search(r"^\s+static:1 .* 0\.9\s+no ", text, re.M)
    assert re.search(r"^ static:1\s+loses\s+goodput -\d.*chat's contract broken", text, re.M)
    assert "every contract static:16 meets met" in text
    pareto_plot(data, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_with_contracts_lead_with_the_promises_and_state_the_rule(contract_eval, monkeypatch, tmp_path):
    """admit results on a scenario with contracts, rendered from an evaluation's JSON: contracts met and the
    shortfall lead the table, a per-tenant table gives each in-contract attainment against its promise, the
    header states the contract rule; a verdict against another policy judges by the contracts too."""
    import yaml
    from admit.evaluate import results
    from admit.evaluate.verdict import CONTRACT_RULE, verdicts

    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "skipped", lambda scenario: [])  # nothing to say why, and no static:best tuning
    raw = load_scenario("h200-live-small").model_dump(exclude_none=True)
    for t in raw["tenants"]:
        t["contract"] = TIGHT[t["name"]]
    path = tmp_path / "small-contracts.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "small-contracts"}))
    out = tmp_path / "docs" / "RESULTS.md"
    (out.parent / "results").mkdir(parents=True)
    (out.parent / "results" / "small-contracts.json").write_text(json.dumps(contract_eval))
    text = results.build(6, [str(path)], 1, out, render_only=True)
    assert f"On {path}, {CONTRACT_RULE}." in text
    assert "| policy | contracts met | shortfall | goodput req/s | p | Jain share |" in text
    assert re.search(r"^\| static:16 \| 2/2 \| 0\.0 \[", text, re.M)
    assert re.search(r"^\| static:1 \| 0/2 \| .*\| \*\*loses\*\* \| goodput -.*chat's contract broken", text, re.M)
    assert "| policy | chat (≥ 0.95) | agent (≥ 0.9) |" in text
    assert re.search(r"^\| static:1 \| 0\.\d{3} \(0\.031\) · \*\*no\*\* \|", text, re.M)
    assert "goodput vs the contract shortfall" in text
    assert results.verdict_against(contract_eval, "static:1", "static:16") == verdicts(contract_eval)["static:1"]


def test_the_shortfall_interval_is_clipped_at_zero_and_no_other_figure_is(tmp_path):
    """The contract shortfall is a count: a sample of many zeros and one large count, whose t-interval reaches
    below 0, gets its lower end at 0, overall and per tenant, with the mean and the upper end unchanged; another
    count with the same sample (drops) keeps its t-interval. A report re-rendered from results stored before the
    bound reads the clipped interval (computed again from the stored values)."""
    from admit.core.stats import summarize
    from admit.evaluate import results
    from admit.evaluate.offline import Evaluation
    from admit.evaluate.report import _pm

    sample = [0.0] * 9 + [120.0]
    t_lo, t_hi = summarize(sample)["ci95"]
    assert t_lo < 0  # the t-interval crosses the bound
    runs = [{"timeouts": s, "contract_shortfall": s, "tenants": {"chat": {"timeouts": s, "contract_shortfall": s}}}
            for s in sample]
    data = Evaluation("x", list(range(10)), ["p"], {"p": runs}, metrics=("timeouts",),
                      tenant_metrics=("timeouts",)).to_json()
    entry = data["policies"]["p"]
    for block in (entry, entry["tenants"]["chat"]):
        short = block["contract_shortfall"]
        assert short["mean"] == pytest.approx(12.0) and short["ci95"] == [0.0, t_hi]
        assert block["timeouts"]["mean"] == short["mean"] and block["timeouts"]["ci95"] == [t_lo, t_hi]
    assert _pm(entry["contract_shortfall"], 1) == f"12.0 +{t_hi - 12.0:.1f}"
    assert _pm(entry["timeouts"], 1) == f"12.0 ±{(t_hi - t_lo) / 2:.1f}"
    # results stored before the bound: re-rendering clips the shortfall from its values, leaves the rest as stored
    for block in (entry, entry["tenants"]["chat"]):
        block["contract_shortfall"]["ci95"] = [t_lo, t_hi]
    data["seeds"] = 10
    path = tmp_path / "x.json"
    path.write_text(json.dumps(data))
    again = results._earlier(path, "x", 10)["policies"]["p"]
    for block in (again, again["tenants"]["chat"]):
        assert block["contract_shortfall"]["ci95"] == [0.0, t_hi] and block["timeouts"]["ci95"] == [t_lo, t_hi]

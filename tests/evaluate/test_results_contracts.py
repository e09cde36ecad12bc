"""`admit results` on tables whose tenants have contracts (evaluate/results.py): static:contract is the baseline,
static:best the tenant-blind reference after it, then plain static, the hand-written controllers, the contract
baselines and controller, static:contract-stale on drift instances only, the learned policies; the header says
how such tables are judged, the summary gives the contracts the baseline meets, and a section measures what
keeping every promise costs, from the JSON. A scenario without contracts is judged and rendered as before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from admit.controllers.static import StaticController
from admit.envs.scenario import load_scenario
from admit.evaluate import results
from admit.evaluate.offline import evaluate, paired_p
from admit.evaluate.verdict import CONTRACT_RULE, RULE, contracts_met
from contract_helpers import AGENT, CHAT, with_contracts

CONTRACTS = {"chat": CHAT, "agent": AGENT}
HORIZON_S = 40.0
SEEDS = 6  # the fewest at which a paired test can decide


def _yaml(tmp_path: Path, name: str, contracts: bool) -> str:
    """h200-live-small (with the tests' contracts, or none) cut to ``HORIZON_S``, as a YAML file."""
    sc = with_contracts("h200-live-small", CONTRACTS if contracts else {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**sc.model_dump(mode="json", exclude_none=True), "name": name,
                                    "horizon_s": HORIZON_S}))
    return str(path)


@pytest.fixture
def quick(monkeypatch):
    """The report's policy lists, short; the tuned static policies as fixed caps (nothing tuned here)."""
    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "HAND_POLICIES", ("static", "naive"))
    monkeypatch.setattr(results, "ABLATIONS", ())
    monkeypatch.setattr(results, "learned_policies", lambda scenario: ["ppo:learned"])
    tuned = (results.CONTRACT, results.BEST, results.STALE)
    monkeypatch.setattr(results, "make_controller", lambda name, scenario=None: StaticController(16)
                        if name in tuned else pytest.fail(f"make_controller({name!r})"))


def test_with_contracts_static_contract_leads_then_the_tenant_blind_reference(quick, tmp_path):
    path = _yaml(tmp_path, "small-contracts", contracts=True)
    assert results.contracted(path) and not results.drifting(path)
    assert results.baseline(path) == (results.CONTRACT, None)
    assert results.policies_for(path) == ["static:contract", "static:best", "static", "naive", "static:share", "apf",
                                          "kueue-borrow", "litellm-reserved", "vtc", "contract", "ppo:learned"]
    assert list(results.CONTRACT_POLICIES) == ["static:share", "apf", "kueue-borrow", "litellm-reserved", "vtc",
                                               "contract"]
    assert not any("static:" in n for n in results.skipped(path))
    # without contracts: static:best, plain static, the rest, and no contract policy (today's list)
    plain = _yaml(tmp_path, "small-plain", contracts=False)
    assert results.baseline(plain) == (results.BEST, None)
    assert results.policies_for(plain) == ["static:best", "static", "naive", "ppo:learned"]


def test_a_baseline_that_cannot_run_falls_back_and_says_why(quick, monkeypatch, tmp_path):
    path = _yaml(tmp_path, "small-contracts", contracts=True)

    class Untuned(StaticController):
        def reset(self, spec, seed=None):
            raise LookupError("no tuned caps for this scenario")

    broken: set[str] = {results.CONTRACT}
    monkeypatch.setattr(results, "make_controller", lambda name, scenario=None: Untuned() if name in broken
                        else StaticController(16))
    base, why = results.baseline(path)
    assert base == "static:best" and "`static:contract` cannot run" in why and "no tuned caps" in why
    assert results.policies_for(path)[:3] == ["static:best", "static", "naive"]
    assert "static:contract" not in results.policies_for(path)
    (note,) = [n for n in results.skipped(path) if "static:contract" in n]
    assert "The baseline is `static:best`" in note
    broken.add(results.BEST)
    base, why = results.baseline(path)
    assert base == "static" and "`static:contract` cannot run" in why and "`static:best` cannot run" in why
    pols = results.policies_for(path)
    assert pols[:2] == ["static", "naive"] and not {"static:best", "static:contract"} & set(pols)
    (note,) = [n for n in results.skipped(path) if "static:best" in n]
    assert note.startswith("Neither `static:contract` nor `static:best` is in this table")


def test_static_contract_stale_runs_on_drift_instances_only(quick, monkeypatch, tmp_path):
    drift = "h200-drift@11000"  # a test instance of the drift family, whose instances draw contracts
    assert results.drifting(drift) and results.contracted(drift)
    pols = results.policies_for(drift)
    assert pols[-2:] == ["static:contract-stale", "ppo:learned"]
    assert pols[:3] == ["static:contract", "static:best", "static"] and pols.count("static:contract-stale") == 1
    assert pols.index("contract") == len(pols) - 3  # after the contract baselines and controller
    assert not results.drifting("h200-mix@11000") and not results.drifting("h200-drift")
    monkeypatch.setattr(results, "contracted", lambda scenario: True)  # another family's instance, with contracts
    assert "static:contract-stale" not in results.policies_for("h200-mix@11000")
    assert "static:contract-stale" not in results.policies_for(_yaml(tmp_path, "small-contracts", contracts=True))


@pytest.fixture(scope="module")
def figures() -> dict:
    """Short evaluations: with contracts (static:16 keeps both, static:1 breaks them) and without."""
    sc = with_contracts("h200-live-small", CONTRACTS, horizon_s=HORIZON_S)
    plain = with_contracts("h200-live-small", {}, horizon_s=HORIZON_S)
    return {"contracts": evaluate(sc, ["static:16", "static:1", "static:4"], seeds=SEEDS).to_json(),
            "plain": evaluate(plain, ["static:16", "static:1"], seeds=SEEDS).to_json()}


def _renamed(data: dict, names: list[str]) -> dict:
    """``data`` with its policies renamed in order (the figures unchanged)."""
    return {**data, "policies": dict(zip(names, data["policies"].values(), strict=True))}


def _render(tmp_path: Path, tables: dict[str, dict], monkeypatch) -> str:
    """The report rendered (`--render-only`) from ``tables``' JSON, by YAML name (a scenario of that shape)."""
    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "skipped", lambda scenario: [])  # no static:best tuning
    monkeypatch.setattr(results, "evaluate", None)  # would fail if called
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "docs" / "RESULTS.md"
    (out.parent / "results").mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in tables.items():
        paths.append(_yaml(tmp_path, name, contracts="contract" in name))
        (out.parent / "results" / f"{name}.json").write_text(json.dumps(data))
    return results.build(SEEDS, paths, 1, out, render_only=True)


def test_the_cost_of_the_promises_is_the_jsons_and_the_header_says_how_contracts_judge(figures, monkeypatch,
                                                                                       tmp_path):
    data = _renamed(figures["contracts"], ["static:contract", "static:best", "static"])
    text = _render(tmp_path, {"small-contracts": data}, monkeypatch)
    path = str(tmp_path / "small-contracts.yaml")
    keep, blind = data["policies"]["static:contract"], data["policies"]["static:best"]
    assert contracts_met(keep) == (2, 2) and contracts_met(blind) == (0, 2)
    # the header: the contracts, the rule, static:contract the baseline, static:best the tenant-blind reference
    assert text.startswith("# Results: every policy against the strongest static caps, judged on the contracts")
    assert "in contract* when it conforms at its arrival to a GCRA envelope" in text
    assert "every contract the baseline meets" in text and "breaks a contract the baseline keeps" in text
    assert f"On {path}, {CONTRACT_RULE}." in text
    assert f"over the {SEEDS} seeds of each table, where the tenants have no contracts: {RULE}." in text
    assert ("The baseline of every table whose tenants have contracts is `static:contract`: per-tenant static caps "
            "tuned for the most goodput subject to every contract being met on the tuning seeds") in text
    assert "`static:best`, caps tuned for goodput alone, blind to the tenants" in text
    assert "tenant-blind reference" in text and "could not make" not in text
    # the summary: the baseline's contracts met
    assert "| scenario | baseline | contracts met | wins | ties | loses |" in text
    assert f"| {path} | `static:contract` {keep['goodput_rps']['mean']:.3f} | 2/2 | " in text
    assert "not `...:best`, `static:contract` or `static:contract-stale`" in text
    # the cost section, figure by figure from the JSON
    section = text[text.index("## What keeping every promise costs"):text.index(f"## {path}")]
    row = next(line for line in section.splitlines() if line.startswith(f"| {path} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    g, gb = keep["goodput_rps"], blind["goodput_rps"]
    p = paired_p(g["values"], gb["values"])
    assert cells == [
        path,
        f"{gb['mean']:.3f} [{gb['ci95'][0]:.3f}, {gb['ci95'][1]:.3f}]", "0/2",
        f"{g['mean']:.3f} [{g['ci95'][0]:.3f}, {g['ci95'][1]:.3f}]", "2/2",
        f"{g['mean'] / gb['mean']:.3f}×", f"{p:.1e}" if p < 1e-3 else f"{p:.3f}",
    ]
    assert (f"Over the 1 table `static:contract` meets 2 of 2 contracts and `static:best` 0 of 2; "
            f"`static:contract`'s goodput is {g['mean'] / gb['mean']:.3f}× `static:best`'s.") in section
    # over several tables: the totals and the range of the ratios
    rows = results.cost_section([("a", data), ("b", data)])
    assert (f"Over the 2 tables `static:contract` meets 4 of 4 contracts and `static:best` 0 of 4; "
            f"`static:contract`'s goodput is {g['mean'] / gb['mean']:.3f}× to {g['mean'] / gb['mean']:.3f}× "
            f"`static:best`'s (median {g['mean'] / gb['mean']:.3f}×).") in rows
    assert results.cost_section([("plain", _renamed(figures["plain"], ["static:best", "static"]))]) == []


def test_a_table_without_contracts_renders_as_before(figures, monkeypatch, tmp_path):
    plain = _renamed(figures["plain"], ["static:best", "static"])
    alone = _render(tmp_path / "alone", {"small-plain": plain}, monkeypatch)
    # today's header, summary and table: no contract text, column or section
    assert alone.startswith("# Results: every policy against the strongest static caps, judged on goodput\n")
    for absent in ("contract", "What keeping every promise costs"):
        assert absent not in alone.replace(str(tmp_path), "TMP")  # the test's folder is named after it
    assert f"The verdict (evaluate/verdict.py), over the {SEEDS} seeds of each table: {RULE}." in alone
    assert ("| scenario | baseline | wins | ties | loses | winners | best adaptive policy | best without tuned caps |"
            in alone)
    assert "The baseline of every table is `static:best`: per-tenant static caps tuned for goodput" in alone
    assert "| policy | goodput req/s | p | attainment | p | worst tenant |" in alone
    # beside a table with contracts its section is the same text, and its summary row says it has no contracts
    both = _render(tmp_path / "both", {"small-plain": plain, "small-contracts": _renamed(
        figures["contracts"], ["static:contract", "static:best", "static"])}, monkeypatch)
    def plain_section(text: str, folder: str) -> str:
        start = text.index(f"## {tmp_path / folder / 'small-plain.yaml'}\n")
        end = text.find("\n## ", start + 1)
        return text[start:end if end >= 0 else None].replace(f"/{folder}/", "/")

    assert plain_section(alone, "alone").rstrip() == plain_section(both, "both").rstrip()
    plain_path = tmp_path / "both" / "small-plain.yaml"
    assert re.search(rf"^\| {re.escape(str(plain_path))} \| `static:best` [\d.]+ \| — \| ", both, re.M)
    assert f"On {plain_path}, whose tenants have no contracts, the baseline is `static:best`" in both


def test_a_report_with_contracts_runs_the_contract_policies(monkeypatch, tmp_path):
    """The whole path, evaluated: a short scenario with contracts runs the contract baselines and controller
    after the hand-written ones, and its JSON and section carry them."""
    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "HAND_POLICIES", ("static",))
    monkeypatch.setattr(results, "learned_policies", lambda scenario: [])
    monkeypatch.setattr(results, "baseline", lambda scenario: ("static:16", None))  # nothing tuned here
    path = _yaml(tmp_path, "small-contracts", contracts=True)
    out = tmp_path / "docs" / "RESULTS.md"
    text = results.build(2, [path], 1, out)
    data = json.loads((out.parent / "results" / "small-contracts.json").read_text())
    assert list(data["policies"]) == ["static:16", "static", *results.CONTRACT_POLICIES]
    for pol in results.CONTRACT_POLICIES:
        assert re.search(rf"^\| {re.escape(pol)} \| \d/2 \| ", text, re.M), pol
    assert "What keeping every promise costs" not in text  # neither static:contract nor static:best ran
    assert load_scenario(path).has_contracts
    # each tenant's excess goodput and borrowed / lent concurrency, the JSON's means
    lend = text[text.index("Per tenant: excess goodput"):]
    for pol, e in data["policies"].items():
        cells = [f"{t['excess_goodput']['mean']:.3f} · {t['borrowed']['mean']:.1f} / {t['lent']['mean']:.1f}"
                 for t in e["tenants"].values()]
        assert f"| {pol} | " + " | ".join(cells) + " |" in lend, pol

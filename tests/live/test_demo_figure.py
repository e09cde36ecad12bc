"""`admit demo`'s time series, contract figures, tables and figure, from a small demo-shaped result (no processes
started).

`run_series` turns a run's decision log and the gateway's request log into each tenant's limits and goodput
over time, and with contracts each contracted tenant's in-contract attainment; `add_contracts` adds a run's
contract figures; `print_table` and `plot_demo` show them, one column per policy. The scenario is the demo's
own (long-context-chat: the chat tenant must start within 0.5 s and stream at 0.05 s a token, the long-context
one end within 120 s), with the contracts each test gives it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from admit.live.demo import add_contracts, plot_demo, print_table, run_series
from contract_helpers import with_contracts
from rich.console import Console

T0 = 1_000_000.0  # the first request's arrival at the gateway, unix seconds


def _line(tenant: str, at: float, ttft: float, e2e: float, tokens: int = 11, outcome: str = "ok") -> dict:
    return {"tenant": tenant, "arrival": T0 + at, "ttft_s": ttft, "e2e_s": e2e, "output_tokens": tokens,
            "outcome": outcome}


def _decision(at: float, long_context: int, chat: int) -> dict:
    return {"time": T0 + at, "limits_after": {"long-context": long_context, "chat": chat}}


LINES = [
    _line("chat", 0.0, 0.2, 0.6),  # good: done at 0.6 s, bin 0
    _line("chat", 1.0, 0.2, 0.6),  # good: done at 1.6 s, bin 0
    _line("chat", 2.0, 0.9, 1.2),  # TTFT over 0.5 s: not good
    _line("chat", 3.0, 0.2, 1.2),  # TPOT (1.2 - 0.2) / 10 = 0.1 s over 0.05 s: not good
    _line("chat", 5.0, 0.1, 0.55),  # good (TPOT 0.045 s), done at 5.55 s: bin 1
    _line("chat", 4.5, None, None, 0, "ttl-expired"),  # dropped: never good
    _line("long-context", 0.5, 30.0, 100.0),  # good, done at 100.5 s: past the 10 s run, so a bin is added
    _line("long-context", 1.0, 30.0, 130.0),  # e2e over 120 s: not good
    {"tenant": "someone-else", "arrival": T0 - 5.0, "ttft_s": 0.1, "e2e_s": 0.2, "output_tokens": 2, "outcome": "ok"},
]
DECISIONS = [_decision(-0.3, 48, 80), {"time": T0 + 1.0, "outcome": "fetch-error"}, _decision(2.0, 32, 96),
             _decision(4.0, 16, 96)]


def test_series_counts_good_completions_per_bin_and_keeps_every_decision() -> None:
    sc = with_contracts("long-context-chat", {}, horizon_s=10)
    s = run_series(DECISIONS, LINES, sc, duration=10.0, bin_s=5.0)
    assert s["t0_unix"] == T0  # an unknown tenant's earlier request does not move the origin
    assert s["limits"] == {"t_s": [0.0, 2.0, 4.0],  # the decision before the traffic is drawn at 0 s
                           "tenants": {"long-context": [48, 32, 16], "chat": [80, 96, 96]}}
    good = s["goodput"]
    assert good["bin_s"] == 5.0 and good["t_s"] == [5.0 * i for i in range(21)]  # up to the 100.5 s completion
    assert good["tenants"]["chat"][:3] == [0.4, 0.2, 0.0] and sum(good["tenants"]["chat"]) == pytest.approx(0.6)
    assert good["tenants"]["long-context"][20] == 0.2 and sum(good["tenants"]["long-context"]) == 0.2


def _result(policies: list[str]) -> dict:
    sc = with_contracts("long-context-chat", {}, horizon_s=10)
    series = run_series(DECISIONS, LINES, sc, duration=10.0)
    return {"scenario": "long-context-chat", "duration_s": 10.0, "seed": 1, "requests": 8, "policies": policies,
            "notes": [], "backend": "admit emulate",
            "runs": {p: {"goodput_rps": 0.4, "series": series} for p in policies}}


def test_plot_draws_one_column_per_policy(tmp_path: Path) -> None:
    from PIL import Image

    one, three = tmp_path / "one.png", tmp_path / "three.png"
    plot_demo(_result(["static:best"]), one)
    plot_demo(_result(["static:best", "ledger:best", "ppo:general"]), three)
    with Image.open(one) as a, Image.open(three) as b:
        assert a.format == b.format == "PNG"
        assert b.height == a.height and b.width == pytest.approx(3 * a.width, rel=0.05)
        assert len(b.convert("RGB").getcolors(maxcolors=1 << 24)) > 10  # lines and text drawn, not a blank canvas


def test_plot_from_a_saved_result_on_the_command_line(tmp_path: Path) -> None:
    saved = tmp_path / "demo.json"
    saved.write_text(json.dumps(_result(["static:best", "ledger:best"])))
    out = tmp_path / "figure.png"
    subprocess.run([sys.executable, "-m", "admit.live.demo", str(saved), str(out)], check=True, timeout=120)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_a_result_without_series(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no run in the result has a time series"):
        plot_demo({"scenario": "x", "seed": 1, "requests": 0, "backend": "b", "runs": {"static": {}}},
                  tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# chat with a contract, long-context without; the gateway classified chat's requests (contract_at, in_contract)
CHAT_CONTRACT = {"requests_per_s": 1.0, "burst": 2, "attainment": 0.75}


def _classified(line: dict, inside: bool) -> dict:
    return {**line, "contract_at": line["arrival"], "in_contract": inside, "prompt_tokens": 100}


CONTRACT_LINES = [
    _classified(_line("chat", 0.0, 0.2, 0.6), True),  # in contract, good (bin 0)
    _classified(_line("chat", 1.0, 0.2, 0.6), True),  # in contract, good (bin 0)
    _classified(_line("chat", 2.0, 0.9, 1.2), True),  # in contract, TTFT over 0.5 s (bin 0)
    _classified(_line("chat", 3.0, 0.2, 0.6), False),  # excess, good
    _classified(_line("chat", 6.0, 0.2, 1.2), True),  # in contract, TPOT over 0.05 s (bin 1)
    {**_line("chat", 6.5, 0.1, 0.2), "outcome": "ok"},  # never classified (no contract_at): not counted
    {**_line("long-context", 0.5, 30.0, 100.0), "prompt_tokens": 9000},  # no contract: its goodput is excess
]


def _contract_run() -> tuple[dict, dict]:
    sc = with_contracts("long-context-chat", {"chat": CHAT_CONTRACT}, horizon_s=10)
    run = {"goodput_rps": 0.4, "tenants": {"long-context": {}, "chat": {}}}
    add_contracts(run, sc, CONTRACT_LINES, 10.0)
    run["series"] = run_series(DECISIONS, CONTRACT_LINES, sc, duration=10.0, bin_s=5.0)
    return run, {"chat": CHAT_CONTRACT}


def test_contract_figures_and_series_of_a_run() -> None:
    run, _ = _contract_run()
    chat = run["tenants"]["chat"]
    # 4 in contract, 2 good: 0.5 < 0.75, short by ceil(0.75 * 4) - 2 = 1 (core/contract.py's rule)
    assert chat["contract_arrived"] == 4 and chat["contract_good"] == 2 and chat["contract_attainment"] == 0.5
    assert chat["contract_met"] is False and chat["contract_shortfall"] == 1
    assert chat["excess_goodput_rps"] == 0.1  # the one good excess request over 10 s
    assert chat["contract"] == CHAT_CONTRACT
    assert "contract_met" not in run["tenants"]["long-context"]
    assert run["tenants"]["long-context"]["excess_goodput_rps"] == 0.1  # promised nothing: all its goodput
    assert (run["contracts"], run["contracts_met"], run["contract_shortfall"]) == (1, 0, 1)
    att = run["series"]["contract_attainment"]
    assert att["target"] == {"chat": 0.75} and att["t_s"] == [0.0, 5.0]
    assert att["per_bin"] == {"chat": [round(2 / 3, 4), 0.0]}
    assert att["cumulative"] == {"chat": [round(2 / 3, 4), 0.5]}  # its last value is the run's


def test_a_scenario_without_contracts_adds_nothing_and_the_table_says_so() -> None:
    sc = with_contracts("long-context-chat", {}, horizon_s=10)
    run: dict = {"tenants": {"long-context": {}, "chat": {}}}
    add_contracts(run, sc, CONTRACT_LINES, 10.0)
    assert run == {"tenants": {"long-context": {}, "chat": {}}}
    assert "contract_attainment" not in run_series(DECISIONS, CONTRACT_LINES, sc, duration=10.0)
    console = Console(record=True, width=132)
    print_table({**_table_result(), "contracts": {}}, console)
    text = console.export_text()
    assert "has no contracts" in text and "contracts kept and broken" not in text and "goodput req/s" in text


def _table_result() -> dict:
    run, contracts = _contract_run()
    for t in run["tenants"].values():
        t.update({"scheduled": 5, "good": 2, "goodput_rps": 0.2, "attainment": 0.4, "ttft_p99_s": 0.9,
                  "e2e_p99_s": 1.2, "ttl_expired": 0, "queue_full": 0, "limits": [48, 32]})
    run.update({"duration_s": 10.0, "ttft_p99_s": 0.9, "e2e_p99_s": 1.2})
    return {"scenario": "long-context-chat", "duration_s": 10.0, "seed": 1, "requests": 7, "notes": [],
            "backend": "admit emulate", "contracts": contracts, "labels": {"static:best": "tenant-blind"},
            "policies": ["static:contract", "static:best"], "runs": {"static:contract": run, "static:best": run}}


def test_the_table_shows_each_contract_kept_or_broken_and_the_plot_its_attainment(tmp_path: Path) -> None:
    from PIL import Image

    result = _table_result()
    console = Console(record=True, width=132)
    print_table(result, console)
    text = console.export_text()
    assert "contracts kept and broken" in text and "BROKEN, 1 short" in text and "0 of 1 kept" in text
    assert "tenant-blind" in text and "none" in text  # the label, and long-context's missing contract
    with_row, without = tmp_path / "contracts.png", tmp_path / "blind.png"
    plot_demo(result, with_row)
    plot_demo({**result, "contracts": {}}, without)  # as a scenario without contracts: no attainment row
    with Image.open(with_row) as a, Image.open(without) as b:
        assert a.width == b.width and a.height > 1.3 * b.height

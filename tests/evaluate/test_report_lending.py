"""`admit evaluate`'s per-tenant table with contracts shows each tenant's excess goodput and the concurrency
it borrowed and lent (evaluate/report.py), within 120 columns, and "—" where a run did not measure them."""

from __future__ import annotations

import copy
import re

import pytest
from admit.envs.scenario import load_scenario, parse_scenario
from admit.evaluate.offline import evaluate
from admit.evaluate.report import print_table
from rich.console import Console

CONTRACTS = {"chat": {"requests_per_s": 1.5, "burst": 5, "attainment": 0.95},
             "agent": {"tokens_per_s": 6000, "burst": 20000, "attainment": 0.9}}


@pytest.fixture(scope="module")
def data() -> dict:
    raw = load_scenario("h200-live-small").model_dump(exclude_none=True)
    for t in raw["tenants"]:
        t["contract"] = CONTRACTS[t["name"]]
    return evaluate(parse_scenario(raw, "h200-live-small with contracts"), ["static:share", "static:2"],
                    seeds=2).to_json()


def _text(data: dict) -> str:
    console = Console(record=True, width=120)
    print_table(data, console)
    return console.export_text()


def test_the_per_tenant_table_shows_excess_goodput_borrowed_and_lent(data: dict) -> None:
    text = _text(data)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 120
    assert "excess" in text and "borrowed" in text and "/ lent" in text
    te = data["policies"]["static:2"]["tenants"]["chat"]
    cells = (f"{te['excess_goodput']['mean']:.3f}", f"{te['borrowed']['mean']:.1f} / {te['lent']['mean']:.1f}")
    assert re.search(rf"^\s+static:2 .* {re.escape(cells[0])}\s+{re.escape(cells[1])}\s", text, re.M)


def test_a_run_without_them_shows_a_dash(data: dict) -> None:
    live = copy.deepcopy(data)  # a live protocol's figures have no lending
    for e in live["policies"].values():
        for te in e["tenants"].values():
            for m in ("excess_goodput", "borrowed", "lent"):
                te.pop(m)
    assert re.search(r"^ chat\s+static:share .* (yes|no)\s+—\s+—\s", _text(live), re.M)

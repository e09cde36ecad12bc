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


def test_lending_over_time_is_the_mean_of_the_seeds_series_and_is_drawn(tmp_path) -> None:
    """`admit evaluate --lending-plot`: each tenant's borrowed and lent concurrency per decision, the mean over
    the seeds of the episodes' series, whose mean over the decisions is the table's figure; drawn per policy."""
    from admit.evaluate.offline import lending_series
    from admit.evaluate.report import lending_plot

    raw = load_scenario("h200-live-small").model_dump(exclude_none=True)
    for t in raw["tenants"]:
        t["contract"] = CONTRACTS[t["name"]]
    ev = evaluate(parse_scenario(raw, "h200-live-small with contracts"), ["static:share", "static:2"], seeds=2)
    series = lending_series(ev)
    data = ev.to_json()
    n = len(series["time_s"])
    assert n > 10 and series["time_s"] == sorted(series["time_s"])
    for pol in ("static:share", "static:2"):
        for name in ("chat", "agent"):
            for key in ("borrowed", "lent"):
                got = series["policies"][pol][key][name]
                per_seed = [r["lending"][key][name] for r in ev.per_seed[pol]]
                assert len(got) == n and got == pytest.approx([(a + b) / 2 for a, b in zip(*per_seed, strict=True)])
                # no warm-up: the table's mean is the mean over the decisions of this series
                assert sum(got) / n == pytest.approx(data["policies"][pol]["tenants"][name][key]["mean"])
    # static:2 holds a slot or two per tenant, under its nominal share: it lends nothing and borrows nothing
    assert not any(series["policies"]["static:2"]["borrowed"]["chat"])
    lending_plot(series, tmp_path / "lending.png", "h200-live-small")
    assert (tmp_path / "lending.png").read_bytes()[:4] == b"\x89PNG"


def test_lending_over_time_needs_contracts() -> None:
    from admit.evaluate.offline import lending_series

    with pytest.raises(ValueError, match="no tenant has a contract"):
        lending_series(evaluate(load_scenario("seed-paper", horizon_s=60), ["static"], seeds=1))

"""A live run's excess goodput, borrowed and lent concurrency (admit.live.protocol ``live_lending``), read from
request-log lines built by hand, with no server: core/contract.py's ``lending`` on the requests in flight at the
control loop's decisions, and they reach the protocol's episodes and statistics by the offline names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from admit.core.contract import lending, nominal_concurrency
from admit.live.protocol import (
    ProtocolError,
    _identity,
    _load_state,
    live_decisions,
    live_episode,
    live_lending,
    statistics,
)
from contract_helpers import AGENT, CHAT, with_contracts

T0 = 1000.0  # the load's start, Unix seconds
DURATION, WARMUP = 10.0, 2.0


def _line(tenant: str, arrival: float, *, wait: float | None = 0.0, e2e: float = 4.16, ttft: float = 0.2,
          out: int = 100, inside: bool | None = True, outcome: str = "ok", path: str = "/v1/completions"
          ) -> dict[str, Any]:
    """A gateway request-log line (gateway/app.py ``Record.line``'s keys that the protocol reads)."""
    return {"tenant": tenant, "arrival": T0 + arrival, "prompt_tokens": 50, "output_tokens": out,
            "queue_wait_s": wait, "ttft_s": ttft, "e2e_s": e2e, "outcome": outcome, "status": 200, "path": path,
            "in_contract": inside, "contract_at": None if inside is None else T0 + arrival}


# chat (nominal 2) runs 5 at once at the decision at 4 s while agent (nominal 6) is idle: chat borrows 3, agent lends 3
LINES = [
    _line("chat", 0.5),  # in the warm-up: in flight after it, not counted as excess
    *(_line("chat", 2.5, wait=0.1, inside=i < 2) for i in range(4)),  # two out of contract, good: excess
    _line("chat", 3.0, wait=None, e2e=0.001, outcome="queue-full", inside=False),  # never admitted
    _line("chat", 7.0, e2e=5.0, ttft=0.9, inside=False),  # out of contract and late: no excess
    _line("agent", 0.1, wait=None, e2e=0.002, inside=None, path="/v1/models"),  # no request to the contract
    _line("agent", 8.5, e2e=1.0),
]
# the loop's log: the first decision on the idle gateway, then every 2 s from the first request; a fetch error
DECISIONS = [{"time": T0 - 0.5, "decision": 1},
             {"time": T0 + 1.0, "outcome": "fetch-error"},
             *({"time": T0 + s + 0.01, "since_traffic_s": s, "decision": 2 + k}
               for k, s in enumerate((2.0, 4.0, 6.0, 8.0))),
             {"time": T0 + 10.01, "since_traffic_s": 10.0, "decision": 6}]  # past the load: the drain's


def test_live_lending_is_core_lending_on_the_requests_in_flight_at_the_loops_decisions() -> None:
    sc = with_contracts("h200-live-small", {"chat": CHAT, "agent": AGENT})
    assert [t.name for t in sc.tenants] == ["chat", "agent"] and sc.interval_s == 2.0
    times, clock = live_decisions(DECISIONS, T0, DURATION, sc.interval_s)
    assert clock.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    per = live_lending(sc, LINES, times, clock >= WARMUP, T0 + WARMUP, DURATION - WARMUP)
    # in flight at each decision, counted by hand: admitted (arrival + queue wait) at or before it, not ended
    flight = [[sum(1 for r in LINES if r["tenant"] == name and r["queue_wait_s"] is not None
                   and r["arrival"] + r["queue_wait_s"] <= t < r["arrival"] + r["e2e_s"]) for name in ("chat", "agent")]
              for t in times]
    assert flight == [[0, 0], [1, 0], [5, 0], [4, 0], [1, 0]]
    nominal = nominal_concurrency(sc.control_spec())
    assert nominal == [2, 6]
    borrowed, lent = lending(flight, nominal)
    after = clock >= WARMUP
    for k, name in enumerate(("chat", "agent")):
        assert per[name]["borrowed"] == borrowed[after, k].mean()
        assert per[name]["lent"] == lent[after, k].mean()
    assert per["chat"]["borrowed"] == per["agent"]["lent"] == pytest.approx((0 + 3 + 2 + 0) / 4)
    assert per["chat"]["lent"] == per["agent"]["borrowed"] == 0.0
    assert per["chat"]["excess_goodput"] == 2 / (DURATION - WARMUP) and per["agent"]["excess_goodput"] == 0.0
    without = with_contracts("h200-live-small", {})
    assert live_lending(without, LINES, times, after, T0 + WARMUP, DURATION - WARMUP) == {}


def test_without_a_decision_log_the_decisions_are_every_interval_of_the_load() -> None:
    times, clock = live_decisions([{"time": T0, "outcome": "fetch-error"}], T0, DURATION, 2.0)
    assert clock.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0] and np.array_equal(times, T0 + clock)


def _run(lend: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A live run's record (admit.live.run.run_live's keys that ``live_episode`` reads) with these figures."""
    t = {"scheduled": 10, "good": 8, "goodput_rps": 1.0, "throughput_rps": 1.2, "ttl_expired": 0, "queue_full": 1,
         "completed": 9, "limits": [4, 4]}
    return {"tenants": {"chat": dict(t), "agent": dict(t)}, "goodput_rps": 2.0, "throughput_rps": 2.4,
            "lending": lend}


def test_the_figures_reach_the_episode_and_the_statistics_by_the_offline_names() -> None:
    lend = {"chat": {"excess_goodput": 0.25, "borrowed": 1.25, "lent": 0.0},
            "agent": {"excess_goodput": 0.0, "borrowed": 0.0, "lent": 1.25}}
    ep = live_episode(_run(lend))
    assert ep["tenants"]["chat"]["borrowed"] == 1.25 and ep["tenants"]["agent"]["lent"] == 1.25
    stats = statistics("h200-live-small", DURATION, ["a", "b"], [0, 1],
                       {p: {s: live_episode(_run(lend)) for s in (0, 1)} for p in ("a", "b")})
    for p in ("a", "b"):
        for name in ("chat", "agent"):
            entry = stats["policies"][p]["tenants"][name]
            assert all(entry[m]["mean"] == lend[name][m] for m in ("excess_goodput", "borrowed", "lent"))


def test_a_protocol_file_written_before_the_lending_figures_is_not_resumed(tmp_path: Path) -> None:
    """Its runs lack the lending figures the statistics would summarise: resuming it is refused, naming why."""
    ident = _identity("h200-live-small", ["static:contract"], 60.0, 0, None)
    out = tmp_path / "protocol.json"
    out.write_text(json.dumps({"protocol": {**ident, "format": "admit-protocol/1"}, "runs": {"0/static": {}}}))
    with pytest.raises(ProtocolError, match=r"format 'admit-protocol/1' \(asked: 'admit-protocol/2'\)"):
        _load_state(out, ident)
    out.write_text(json.dumps({"protocol": ident, "runs": {"0/static": {}}}))
    assert _load_state(out, ident) == {"0/static": {}}

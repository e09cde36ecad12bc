"""`admit demo` end to end on loopback, shortened: every run completes requests, the contracts kept and broken
agree with the per-tenant figures, and nothing is left running.

Per policy the demo starts an emulator, a gateway, a control loop and a load generator as process groups
and writes each pid to ``pids.txt`` in that run's working directory (``run0/``, ``run1/``); after a normal
exit, and after a SIGTERM in the middle of a run, every one of them must be gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from admit.core.contract import Contract, shortfall
from admit.live.stack import alive
from contract_helpers import with_contracts

# generous: the deadlines only bound a hang; a quiet machine needs about 30 s and 6 s (a loaded one, more)
pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


def _pids(workdir: Path) -> dict[str, int]:
    """The pids a stack in ``workdir`` recorded, and those of the demo's per-run stacks in run*/ ("run0/name")."""
    out = {}
    for path in [workdir / "pids.txt", *sorted(workdir.glob("run*/pids.txt"))]:
        if not path.is_file():
            continue
        prefix = "" if path.parent == workdir else f"{path.parent.name}/"
        # only complete lines: the demo may be appending one while we read (a line is "name pid\n")
        lines = path.read_text().split("\n")[:-1]
        out.update({f"{prefix}{name}": int(pid) for name, pid in (line.split() for line in lines)})
    return out


def _all_gone(pids: dict[str, int], timeout: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = [f"{n}={p}" for n, p in pids.items() if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _demo(tmp_path: Path, *args: str, policies: tuple[str, ...] = ("static", "robust")) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "admit.cli", "demo", *(a for p in policies for a in ("--policy", p)),
         "--out", str(tmp_path / "demo.json"),
         "--workdir", str(tmp_path / "work"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


# long-context-chat with a contract on each tenant (feasible together): chat's needs more than one request in
# flight to keep (it sends ~5 req/s, each holding its slot for seconds), long-context's is kept by any policy
# that lets its few requests run (their objective is 120 s end to end)
CONTRACTS = {"chat": {"requests_per_s": 1.5, "burst": 5, "attainment": 0.9},
             "long-context": {"requests_per_s": 0.5, "burst": 2, "attainment": 0.5}}


def test_demo_shows_contracts_kept_and_broken_on_the_same_requests_and_cleans_up(tmp_path: Path) -> None:
    scenario = tmp_path / "lcc-contracts.yaml"
    # a queue timeout of 10 s (30 s in the scenario): a starved tenant's queue empties sooner, so the runs end sooner
    sc = with_contracts("long-context-chat", CONTRACTS, admission={"queue_timeout_s": 10, "max_queue": 2000})
    scenario.write_text(yaml.safe_dump(sc.model_dump(mode="json", exclude_none=True), sort_keys=False))
    # static:64,1 walks chat's limit down to 1 (16 a decision) and starves it; contract is the default's controller
    # a warm-up of two 5 s bins: its requests are played and shown per bin, never judged
    proc = _demo(tmp_path, "--scenario", str(scenario), "--duration", "6", "--warmup", "10", "--policy",
                 "ppo:no-such-policy", policies=("static:64,1", "contract"))
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["policies"] == ["static:64,1", "contract"]
    assert len(data["notes"]) == 1 and "ppo:no-such-policy is left out" in data["notes"][0]  # named, not run
    assert {n: {k: float(v) for k, v in c.items()} for n, c in data["contracts"].items()} == CONTRACTS
    for run in data["runs"].values():
        assert set(run["tenants"]) == {"long-context", "chat"}
        for name, t in run["tenants"].items():
            assert t["scheduled"] > 0 and 0 <= t["completed"] <= t["scheduled"]
            assert 0 <= t["good"] <= t["completed"] and t["attainment"] == round(t["good"] / t["scheduled"], 4)
            # the per-tenant contract figures hold together, and kept means the promise (core/contract.py's rule)
            assert t["contract"] == data["contracts"][name]
            assert 0 < t["contract_arrived"] <= t["scheduled"] and 0 <= t["contract_good"] <= t["contract_arrived"]
            assert t["contract_attainment"] == round(t["contract_good"] / t["contract_arrived"], 4)
            short = shortfall(Contract(**t["contract"]), t["contract_arrived"], t["contract_good"])
            assert t["contract_shortfall"] == short and t["contract_met"] is (short == 0)
            assert t["contract_met"] is (t["contract_good"] >= t["contract"]["attainment"] * t["contract_arrived"])
            assert 0 <= t["excess_goodput_rps"] <= (t["scheduled"] - t["contract_arrived"]) / 6
        tenants = run["tenants"].values()
        assert run["contracts"] == 2
        assert run["contracts_met"] == sum(t["contract_met"] for t in tenants)
        assert run["contract_shortfall"] == sum(t["contract_shortfall"] for t in tenants)
        assert run["completed"] > 0 and run["e2e_p99_s"] > 0
        assert run["decisions"] >= 1  # the loop really ran
        assert 1 <= len(run["series"]["limits"]["t_s"]) <= run["decisions"]  # a point per decision that set limits
        assert run["goodput_rps"] == round(sum(t["good"] for t in tenants) / 6, 4)
        att = run["series"]["contract_attainment"]
        assert att["target"] == {n: c["attainment"] for n, c in CONTRACTS.items()}
        # the warm-up ends 10 s after the load generator's start, about 10 s after the first arrival; the first
        # bin lies in it: chat's in-contract requests there are drawn, and counted nowhere
        assert run["warmup_s"] == 10.0 and 5.0 <= run["series"]["judged_from_s"] <= 15.0
        assert att["per_bin"]["chat"][0] is not None and att["cumulative"]["chat"][0] is None
        for name, t in run["tenants"].items():  # the cumulated series ends at the table's figure
            last = [v for v in att["cumulative"][name] if v is not None][-1]
            assert last == t["contract_attainment"]
            assert all(v is None or 0 <= v <= 1 for v in att["per_bin"][name])
    arrived = {p: {n: t["scheduled"] for n, t in r["tenants"].items()} for p, r in data["runs"].items()}
    assert arrived["static:64,1"] == arrived["contract"]  # the same requests for every policy
    starved = data["runs"]["static:64,1"]["tenants"]
    assert starved["chat"]["limits"][-1] == 1 and set(starved["long-context"]["limits"]) == {64}
    assert not starved["chat"]["contract_met"] and starved["chat"]["contract_shortfall"] > 0  # starved: broken
    assert starved["long-context"]["contract_met"]  # the engine all to itself: kept
    assert data["runs"]["static:64,1"]["contracts_met"] == 1
    assert "contracts kept and broken" in out and "BROKEN" in out and "1 of 2 kept" in out  # the tables were printed
    assert "goodput req/s" in out and "long-context" in out
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"  # and the picture drawn next to the JSON
    pids = _pids(tmp_path / "work")
    started = {"run0/emulator", "run0/gateway-live", "run0/control-live", "run0/loadgen-live", "run1/gateway-live"}
    assert started <= set(pids)
    assert _all_gone(pids) == []

    # the same result as a scenario without contracts would give: said plainly, drawn without the attainment row
    from admit.live.demo import plot_demo, print_table
    from rich.console import Console

    blind = {**data, "contracts": {}, "runs": {p: {**r, "series": {k: v for k, v in r["series"].items()
                                                                   if k != "contract_attainment"}}
                                               for p, r in data["runs"].items()}}
    console = Console(record=True, width=132)
    print_table(blind, console)
    text = console.export_text()
    assert "has no contracts" in text and "contracts kept and broken" not in text and "goodput req/s" in text
    plot_demo(blind, tmp_path / "blind.png")
    assert (tmp_path / "blind.png").read_bytes()[:4] == b"\x89PNG"


def test_sigterm_mid_run_stops_every_process(tmp_path: Path) -> None:
    proc = _demo(tmp_path, "--duration", "60")
    deadline = time.monotonic() + 120
    while "run0/loadgen-live" not in _pids(tmp_path / "work"):
        assert proc.poll() is None and time.monotonic() < deadline, "the demo never started its load"
        time.sleep(0.05)
    pids = _pids(tmp_path / "work")
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert _all_gone(pids) == []


def test_sigterm_while_a_child_starts_still_stops_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM that lands after Popen returned but before the stack recorded the child: the stack still
    knows the child, so leaving the ``with`` stops it (the signal is raised once the child is recorded)."""
    from admit.live import stack as stack_mod

    real_popen = subprocess.Popen
    started: list[int] = []

    def popen_then_sigterm(*args, **kw):  # the real Popen; the signal is only timed into the window
        proc = real_popen(*args, **kw)
        started.append(proc.pid)
        os.kill(os.getpid(), signal.SIGTERM)  # its Python handler runs at the next bytecode, i.e. right here
        return proc

    with pytest.raises(KeyboardInterrupt), stack_mod.Stack(tmp_path) as st:
        monkeypatch.setattr(stack_mod.subprocess, "Popen", popen_then_sigterm)
        st.spawn("sleeper", ["-c", "import time; time.sleep(600)"])
        pytest.fail("the SIGTERM was not raised once the child was recorded")
    assert len(started) == 1
    assert _pids(tmp_path) == {"sleeper": started[0]}
    assert _all_gone({"sleeper": started[0]}) == []


def test_a_part_runs_in_its_own_group_in_this_session(tmp_path: Path) -> None:
    """A part is a process group (stop ends the workers it started with it) in the session of the command that
    started the stack: a new session would be weighed by Linux's autogroup scheduler as one whole session,
    whatever the caller's priority."""
    from admit.live.stack import Stack

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
            " time.sleep(600)")
    with Stack(tmp_path) as st:
        part = st.spawn("parent", ["-c", code])
        assert os.getpgid(part.pid) == part.pid
        assert os.getsid(part.pid) == os.getsid(0)
        # its worker, once started, is in its group
        def group() -> list[int]:
            pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
            out = []
            for pid in pids:
                try:
                    if os.getpgid(pid) == part.pid:
                        out.append(pid)
                except ProcessLookupError:
                    pass
            return out
        deadline = time.monotonic() + 60
        while len(group()) < 2:
            assert time.monotonic() < deadline, "the part's worker did not start"
            time.sleep(0.05)
        members = group()
        st.stop("parent")
    assert _all_gone({str(p): p for p in members}) == []

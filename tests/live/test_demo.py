"""`admit demo` end to end on loopback, shortened: every run completes requests, and nothing is left running.

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
from admit.live.stack import alive

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


def _demo(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "admit.cli", "demo", "--policy", "static", "--policy", "robust",
         "--out", str(tmp_path / "demo.json"),
         "--workdir", str(tmp_path / "work"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_demo_runs_every_policy_on_the_same_requests_and_cleans_up(tmp_path: Path) -> None:
    proc = _demo(tmp_path, "--duration", "6", "--policy", "ppo:no-such-policy")
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["scenario"] == "long-context-chat" and data["policies"] == ["static", "robust"]
    assert len(data["notes"]) == 1 and "ppo:no-such-policy is left out" in data["notes"][0]  # named, not run
    for run in data["runs"].values():
        assert set(run["tenants"]) == {"long-context", "chat"}
        for t in run["tenants"].values():
            assert t["scheduled"] > 0 and t["completed"] > 0 and t["e2e_p99_s"] > 0
            assert 0 <= t["good"] <= t["completed"] and t["attainment"] == round(t["good"] / t["scheduled"], 4)
        assert run["decisions"] >= 1  # the loop really ran
        assert 1 <= len(run["series"]["limits"]["t_s"]) <= run["decisions"]  # a point per decision that set limits
        assert run["goodput_rps"] == round(sum(t["good"] for t in run["tenants"].values()) / 6, 4)
    arrived = {p: {n: t["scheduled"] for n, t in r["tenants"].items()} for p, r in data["runs"].items()}
    assert arrived["static"] == arrived["robust"]  # the same requests for every policy
    assert set(data["runs"]["static"]["tenants"]["chat"]["limits"]) == {64}  # static holds the initial caps
    assert "goodput req/s" in out and "long-context" in out  # the table was printed
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"  # and the picture drawn next to the JSON
    pids = _pids(tmp_path / "work")
    started = {"run0/emulator", "run0/gateway-live", "run0/control-live", "run0/loadgen-live", "run1/gateway-live"}
    assert started <= set(pids)
    assert _all_gone(pids) == []


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

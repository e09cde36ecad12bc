"""`admit demo` end to end on loopback, shortened: both runs complete requests, and nothing is left running.

The demo starts the emulator, two gateways, two control loops and two load generators as process groups
and writes each pid to ``pids.txt`` in its working directory; after a normal exit, and after a SIGTERM
in the middle of a run, every one of them must be gone.
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
pytestmark = pytest.mark.timeout(300)


def _pids(workdir: Path) -> dict[str, int]:
    path = workdir / "pids.txt"
    if not path.is_file():
        return {}
    # only complete lines: the demo may be appending one while we read (a line is "name pid\n")
    lines = path.read_text().split("\n")[:-1]
    return {name: int(pid) for name, pid in (line.split() for line in lines)}


def _all_gone(pids: dict[str, int], timeout: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = [f"{n}={p}" for n, p in pids.items() if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _demo(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "admit.cli", "demo", "--policy", "robust", "--out", str(tmp_path / "demo.json"),
         "--workdir", str(tmp_path / "work"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_demo_runs_static_and_policy_and_cleans_up(tmp_path: Path) -> None:
    proc = _demo(tmp_path, "--duration", "6")
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    data = json.loads((tmp_path / "demo.json").read_text())
    assert set(data["runs"]) == {"static", "policy"} and data["runs"]["policy"]["policy"] == "robust"
    for run in data["runs"].values():
        assert set(run["tenants"]) == {"bursty", "steady"}
        for t in run["tenants"].values():
            assert t["completed"] > 0 and t["e2e_p99_s"] > 0
        assert run["decisions"] >= 1  # the loop really ran
    assert data["runs"]["static"]["tenants"]["bursty"]["limits"][-1] == data["initial_limit"]  # static holds
    assert "static" in out and "bursty" in out  # the table was printed
    pids = _pids(tmp_path / "work")
    assert {"emulator", "gateway-static", "control-static", "loadgen-static", "gateway-policy"} <= set(pids)
    assert _all_gone(pids) == []


def test_sigterm_mid_run_stops_every_process(tmp_path: Path) -> None:
    proc = _demo(tmp_path, "--duration", "60")
    deadline = time.monotonic() + 120
    while "loadgen-static" not in _pids(tmp_path / "work"):
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

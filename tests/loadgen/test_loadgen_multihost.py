"""`admit loadgen run --agents`: one stage on several hosts, here network namespaces of this machine.

Three namespaces (the mock server and two agents) hang off a bridge in the root namespace, where the
coordinator runs. The module is skipped only when namespaces cannot be created (not root, no `ip`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from admit.loadgen.cli import build_config
from admit.loadgen.histogram import Histogram
from admit.loadgen.schedule import build_schedule
from proc_helpers import read_listening

START_TIMEOUT_S = 60  # generous: these only bound a hang
RUN_TIMEOUT_S = 120
TENANTS = ["name=a,rate=100,arrival=poisson,prompt=16,output=4", "name=b,rate=50,arrival=constant,prompt=8,output=3"]
LOADGEN = [sys.executable, "-c", "from admit.loadgen.cli import app; app(prog_name='admit loadgen')"]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _netns_usable() -> str | None:
    """None when a namespace can be created here, else why not (the skip reason)."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"admit-probe-{secrets.token_hex(3)}"
    res = _ip("netns", "add", probe)
    if res.returncode != 0:
        return f"`ip netns add` failed: {res.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


_why_not = _netns_usable()
pytestmark = [pytest.mark.system,
              pytest.mark.skipif(_why_not is not None, reason=f"cannot create network namespaces: {_why_not}")]


@dataclass
class Net:
    """Namespaces ``srv``, ``a1``, ``a2`` on one bridge; addresses by name; processes to stop at the end."""

    ns: dict[str, str]
    addr: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self, where: str, args: list[str], what: str) -> str:
        """Start ``args`` in namespace ``where``; its ``HOST:PORT`` once it prints ``listening on``."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns[where], *args], stdout=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return read_listening(proc, START_TIMEOUT_S, what).removeprefix("http://")

    def agent(self, where: str, *extra: str) -> str:
        return self.start(where, [*LOADGEN, "agent", "--listen", f"{self.addr[where]}:0", *extra], f"agent in {where}")


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    tag = secrets.token_hex(3)
    subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    bridge = f"admbr{tag}"
    names = ("srv", "a1", "a2")
    net = Net(ns={n: f"admit-{n}-{tag}" for n in names}, addr={n: f"{subnet}.{10 + i}" for i, n in enumerate(names)})
    made_ns: list[str] = []
    made_links: list[str] = []

    def must(*args: str) -> None:
        res = _ip(*args)
        if res.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")

    try:
        must("link", "add", bridge, "type", "bridge")
        made_links.append(bridge)
        must("addr", "add", f"{subnet}.1/24", "dev", bridge)
        must("link", "set", bridge, "up")
        for i, n in enumerate(names):
            ns, host_end, ns_end = net.ns[n], f"vh{tag}{i}", f"vn{tag}{i}"
            must("netns", "add", ns)
            made_ns.append(ns)
            must("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            made_links.append(host_end)
            must("link", "set", ns_end, "netns", ns)
            must("link", "set", host_end, "master", bridge)
            must("link", "set", host_end, "up")
            must("-n", ns, "link", "set", "lo", "up")
            must("-n", ns, "addr", "add", f"{net.addr[n]}/24", "dev", ns_end)
            must("-n", ns, "link", "set", ns_end, "up")
        yield net
    finally:
        for p in net.procs:
            p.terminate()
        for p in net.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        for ns in made_ns:  # deleting a namespace deletes the veth end inside it, and so its peer
            _ip("netns", "del", ns)
        for link in reversed(made_links):
            if _ip("link", "show", link).returncode == 0:
                _ip("link", "del", link)
        left = [ns for ns in made_ns if ns in _ip("netns", "list").stdout]
        assert not left, f"namespaces left behind: {left}"


@pytest.fixture(scope="module")
def server(net: Net) -> str:
    hp = net.start("srv", [sys.executable, "-m", "admit.loadgen.mockserver", "--host", net.addr["srv"], "--port", "0"],
                   "mock server")
    return f"http://{hp}"


def _run(server: str, agents: list[str], out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [*LOADGEN, "run", "--url", server, "--model", "mock", "--duration", "2", "--seed", "11", "--workers", "1",
           "--agents", ",".join(agents), "--out", str(out), "--no-plot", *extra]
    for t in TENANTS:
        cmd += ["--tenant", t]
    env = {**os.environ, "COLUMNS": "250"}  # rich wraps error lines at the terminal width
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)


def _schedule_size() -> tuple[int, dict[str, int]]:
    cfg = build_config(None, {"url": "http://x:1", "duration": 2.0, "seed": 11, "model": "mock"}, TENANTS, None)
    sch = build_schedule(cfg.checked())
    return len(sch), dict(zip(["a", "b"], sch.count_by_tenant(2), strict=True))


def test_merged_report_is_the_single_host_schedule(net: Net, server: str, tmp_path: Path) -> None:
    agents = [net.agent("a1"), net.agent("a2")]
    res = _run(server, agents, tmp_path, "--lag-bound-ms", "500")
    assert res.returncode == 0, res.stderr
    stage = json.loads((tmp_path / "stage_0.json").read_text())
    size, per_tenant = _schedule_size()
    assert stage["load_summary"]["scheduled"] == size
    assert stage["load_summary"]["sent"] == size
    assert stage["requests"]["completed"] == size
    hosts = stage["hosts"]
    assert [h["host"] for h in hosts] == agents
    assert sum(h["sent"] for h in hosts) == size
    assert abs(hosts[0]["sent"] - hosts[1]["sent"]) <= 1  # striding: every other request
    for name, count in per_tenant.items():
        assert stage["tenants"][name]["load_summary"]["sent"] == count
        assert sum(h["tenants"][name] for h in hosts) == count
    for h in hosts:
        assert isinstance(h["clock_offset_ms"], float) and abs(h["clock_offset_ms"]) < 50
        assert h["clock_rtt_ms"] >= 0 and h["send_lag_p99_ms"] is not None
        assert not h["late"], h
    # histograms: the total is the exact merge of the tenants' and of the hosts'
    total = stage["histograms_ns"]
    for key, long in (("ttft", "time_to_first_token"), ("e2e", "request_latency")):
        assert total[key]["count"] == size
        assert sum(stage["tenants"][n]["latency"][long]["count"] for n in per_tenant) == total[key]["count"]
    merged = Histogram()
    for h in hosts:
        merged.merge(Histogram.from_dict(h["histograms_ns"]["send_lag"]))
    assert merged.to_dict() == total["send_lag"]
    csv_rows = (tmp_path / "stages.csv").read_text().splitlines()
    assert len(csv_rows) == 2


def test_late_host_makes_the_stage_invalid(net: Net, server: str, tmp_path: Path) -> None:
    good = net.agent("a1")
    late = net.agent("a2", "--delay-start-ms", "1500")  # test-only knob: its workers start 1.5 s late
    res = _run(server, [good, late], tmp_path, "--lag-bound-ms", "500")
    assert res.returncode == 0, res.stderr
    stage = json.loads((tmp_path / "stage_0.json").read_text())
    assert stage["valid"] is False
    assert any(late in r and "late" in r for r in stage["invalid_reasons"]), stage["invalid_reasons"]
    assert not any(good in r for r in stage["invalid_reasons"])
    by_host = {h["host"]: h for h in stage["hosts"]}
    assert by_host[late]["late"] and by_host[late]["send_lag_p99_ms"] > 500
    assert not by_host[good]["late"]
    assert stage["load_summary"]["sent"] == _schedule_size()[0]  # late, but nothing lost
    res = _run(server, [good, late], tmp_path / "strict", "--lag-bound-ms", "500", "--strict")
    assert res.returncode == 3


def test_clock_offset_above_the_bound_is_refused(net: Net, server: str, tmp_path: Path) -> None:
    good = net.agent("a1")
    skewed = net.agent("a2", "--clock-skew-ms", "400")  # test-only knob: its wall clock reads 400 ms ahead
    res = _run(server, [good, skewed], tmp_path, "--max-clock-offset-ms", "100")
    assert res.returncode == 2
    err = " ".join(res.stderr.split())
    assert skewed in err and "clock offset" in err and "+4" in err, err
    assert not (tmp_path / "stage_0.json").exists()

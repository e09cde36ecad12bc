"""Telemetry → Observation and the control loop, live: the emulator, the gateway and the loop as real parts.

The live Observation has the simulator's layout for the same tenants; stale engine telemetry reads as a
saturated server; a policy that raises, overruns its deadline or returns garbage changes nothing and is
replaced by static after N failures, and so is the LLM policy whose endpoint fails every call (it holds and
reports ``last_failure``); shadow mode touches nothing; a good policy's decisions reach the gateway's audit
log through `admit control`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest
from admit.agents.llm_config import LLMConfig
from admit.agents.llm_policy import LLMPolicy
from admit.agents.registry import make_controller
from admit.core.observation import Observation
from admit.core.spec import ControlSpec
from admit.core.wire import spec_from_json
from admit.envs.scenario import load_scenario
from admit.envs.simulation import Simulation
from admit.gateway.config import parse_config
from admit.gateway.telemetry import LiveTelemetry
from admit.live.control import ControlLoop, GatewayClient
from emulator_helpers import Emulator, start_emulator
from gateway_helpers import ADMIN_TOKEN, GatewayProcess, key, tenant_cfg, wait_for
from llm_scripted_server import ScriptedServer, Step
from redis_helpers import free_port

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
MODEL = "emu-model"
SLO = {"slo": {"e2e_s": 12, "e2e_p99_s": 12}}  # seed-paper's objectives


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator("--model", MODEL, "--max-model-len", "4096", "--seed", "3")
    yield e
    e.stop()


@pytest.fixture(scope="module")
def gw(emu: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = {
        "telemetry": {"scrape_interval_s": 0.2, "stale_after_s": 10, "window_s": 6},
        "control": {"min_limit": 1, "max_limit": 4, "max_step": 1, "interval_s": 3},
        "tenants": [tenant_cfg("bursty", limit=3, **SLO), tenant_cfg("steady", limit=3, **SLO)],
    }
    g = GatewayProcess(tmp_path_factory.mktemp("gw"), emu.url, cfg)
    yield g
    g.stop()


def client(gw: GatewayProcess) -> GatewayClient:
    return GatewayClient(gw.url, ADMIN_TOKEN, timeout_s=20)


async def _requests(url: str, tenant: str, n: int) -> list[int]:
    body = {"model": MODEL, "prompt": "hello " * 20, "max_tokens": 4, "ignore_eos": True}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key(tenant)}"}) as s:
        async def one() -> int:
            async with s.post(url + "/v1/completions", json=body) as r:
                await r.read()
                return r.status

        return await asyncio.gather(*(one() for _ in range(n)))


def test_live_observation_has_the_simulators_layout(gw: GatewayProcess) -> None:
    assert asyncio.run(_requests(gw.url, "bursty", 3)) == [200] * 3
    c = client(gw)
    data = wait_for(lambda: (d := c.observation())["telemetry"]["scrapes"] > 0 and d, 20, "a scrape")
    scenario = load_scenario("seed-paper")
    sim = Simulation(scenario, seed=0)
    sim_obs = sim.observe()
    live = data["vector"]
    assert len(live) == len(sim_obs.to_vector()) == Observation.vector_size(2)
    assert data["feature_names"] == Observation.feature_names([t.name for t in scenario.tenants])
    o = data["observation"]
    bursty, steady = o["tenants"]
    assert (bursty["name"], bursty["arrivals"], bursty["completions"], bursty["limit"]) == ("bursty", 3, 3, 3)
    assert bursty["samples"] == 3 and bursty["e2e_p99"] > 0 and bursty["ttft_p99"] > 0
    assert steady["arrivals"] == 0 and steady["samples"] == 0
    assert bursty["slo_e2e_p99"] == 12 and bursty["slo_ttft_p99"] == 1.0e4  # the simulator's NO_SLO
    assert data["telemetry"]["stale"] is False and data["telemetry"]["gpu_mem_source"] == "vllm:kv_cache_usage_perc"
    assert 0 <= o["gpu_mem_util"] <= 1 and o["engine_waiting"] == 0
    gpu = data["telemetry"]["gpu"]  # a GPU machine reports memory; a CPU one says why not, and nothing fails
    assert (gpu["available"] is True and gpu["devices"]) or (gpu["available"] is False and gpu["reason"])
    # the gateway's spec is the scenario's (same tenants, SLOs, bounds): a simulator-trained policy fits as is
    spec = spec_from_json(c.spec())
    ref = scenario.control_spec()
    assert spec.tenants == ref.tenants and spec.limits.max == ref.limits.max and spec.window_s == ref.window_s


def test_the_live_windows_slide_like_the_simulators(emu: Emulator, tmp_path: Path) -> None:
    """Window counts and percentiles cover the last window_s seconds, as in the simulator, not the whole run.

    A 3 s window: the observation read right after the requests must still hold them, which a 1 s window
    does not guarantee on a loaded machine (a request and an admin call can take that long there)."""
    cfg = {"telemetry": {"scrape_interval_s": 0.2, "window_s": 3.0},
           "tenants": [tenant_cfg("bursty", limit=3, **SLO), tenant_cfg("steady", limit=3, **SLO)]}
    g = GatewayProcess(tmp_path, emu.url, cfg)
    try:
        c = client(g)
        assert asyncio.run(_requests(g.url, "bursty", 2)) == [200] * 2
        seen = c.observation()["observation"]["tenants"][0]
        assert (seen["arrivals"], seen["completions"]) == (2, 2) and seen["e2e_p99"] > 0
        gone = wait_for(lambda: (t := c.observation()["observation"]["tenants"][0])["completions"] == 0 and t, 30,
                        "the two completions to leave the 3 s window")
        assert gone["arrivals"] == gone["samples"] == 0 and gone["e2e_p99"] == 0  # arrivals left it first
        assert asyncio.run(_requests(g.url, "bursty", 1)) == [200]  # a new event counts from zero again
        again = c.observation()["observation"]["tenants"][0]
        assert (again["arrivals"], again["completions"]) == (1, 1)
    finally:
        g.stop()


def test_a_loop_started_on_traffic_decides_on_the_simulators_schedule(emu: Emulator, tmp_path: Path) -> None:
    """Decision k after the first arrival comes k intervals after it (the simulator's clock starts there too).

    The load starts half an interval after the loop's first decision, so a loop on its own schedule would be
    half an interval off and fail the bound. The interval is 1.5 s and the bound 0.3 s (a loop on its own
    schedule is 0.75 s off): the loop learns the arrival by polling the gateway, and on a loaded machine the
    polls' round trips and the loop thread's wake-ups can take more than the 0.1 s a 0.5 s interval allowed.
    """
    cfg = {"telemetry": {"scrape_interval_s": 0.2, "window_s": 6},
           "tenants": [tenant_cfg("bursty", limit=3, **SLO), tenant_cfg("steady", limit=3, **SLO)]}
    (tmp_path / "gw").mkdir()
    g = GatewayProcess(tmp_path / "gw", emu.url, cfg)
    interval, tol, log = 1.5, 0.3, tmp_path / "decisions.jsonl"
    loop = ControlLoop(client(g), make_controller("static"), _spec(g, interval), log_path=log, start_on_traffic=True)
    runner = threading.Thread(target=loop.run, kwargs={"steps": 4}, daemon=True)
    try:
        runner.start()
        first = wait_for(lambda: log.is_file() and log.read_text().count("\n") >= 1, 20, "the first decision")
        assert first
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert lines[0]["observation"]["tenants"]["bursty"]["arrivals"] == 0  # decided before any traffic
        # Not waiting for anything: this puts the load's start half an interval off the loop's own schedule.
        time.sleep(max(0.0, lines[0]["time"] + interval / 2 - time.time()))
        assert asyncio.run(_requests(g.url, "bursty", 1)) == [200]
        runner.join(timeout=30)
        assert not runner.is_alive()
        arrival = wait_for(lambda: [r for r in g.request_log() if r["path"] == "/v1/completions"], 10,
                           "the request's log line")[0]["arrival"]
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert len(lines) == 4
        after = [x["time"] - arrival for x in lines[1:]]  # the gateway's own arrival stamp, not the loop's guess
        assert all(abs(a - k * interval) < tol for k, a in enumerate(after, start=1)), after
        assert all(abs(x["since_traffic_s"] - k * interval) < tol for k, x in enumerate(lines[1:], start=1))
    finally:
        loop.close()
        g.stop()


def test_stale_telemetry_reads_as_saturated(tmp_path: Path) -> None:
    cfg = parse_config({"telemetry": {"metrics_url": f"http://127.0.0.1:{free_port()}/metrics",
                                      "stale_after_s": 0.5, "stale_waiting": 50, "nvml": False},
                        "tenants": [tenant_cfg("a")]})
    snap = {"tenants": {"a": {"queue_depth": 0, "in_flight": 0, "limit": 4}}}

    async def run() -> tuple[Observation, dict]:
        tel = LiveTelemetry(cfg, "http://127.0.0.1:1")
        await tel.start()
        try:
            await asyncio.to_thread(wait_for, lambda: tel.scrape_errors >= 1, 20, "a failed scrape")
            return tel.observation(snap)
        finally:
            await tel.close()

    obs, info = asyncio.run(run())
    assert info["stale"] is True and info["gpu_mem_source"] == "stale" and info["last_error"]
    assert obs.gpu_mem_util == 1.0 and obs.engine_waiting == 50  # saturated, never idle
    assert info["gpu"] == {"available": False, "reason": "disabled in the configuration"}


class Scripted:
    """A policy that misbehaves in turn as scripted: raises, returns garbage, sleeps past its deadline."""

    name = "scripted-bad"

    def __init__(self, script: Sequence[str]) -> None:
        self.script = list(script)
        self.calls = 0
        self.wake = threading.Event()  # set by the test when done, so a call past its deadline ends then

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.n = spec.n_tenants

    def act(self, obs: Observation) -> list[int]:
        what = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if what == "raise":
            raise RuntimeError("scripted failure")
        if what == "sleep":  # far past any deadline
            self.wake.wait(60.0)
            return [-1] * self.n
        if what == "garbage":
            return [7, "x"]  # type: ignore[list-item]
        return [-1] * self.n


def _spec(gw: GatewayProcess, interval: float) -> ControlSpec:
    from dataclasses import replace

    return replace(spec_from_json(client(gw).spec()), interval_s=interval)


def _limits(gw: GatewayProcess) -> dict[str, int]:
    return {n: t["limit"] for n, t in gw.state()["tenants"].items()}


def test_bad_policy_holds_then_falls_back_to_static(gw: GatewayProcess, tmp_path: Path) -> None:
    before, audit_before = _limits(gw), len(gw.audit_log())
    policy = Scripted(["raise", "garbage", "sleep", "ok"])
    # a 2 s deadline: the calls that answer at once must meet it on a loaded machine too
    loop = ControlLoop(client(gw), policy, _spec(gw, 0.2), act_timeout_s=2.0, max_failures=3,
                       fallback=make_controller("static"), log_path=tmp_path / "decisions.jsonl")
    try:
        stats = loop.run(steps=5)
    finally:
        policy.wake.set()
        loop.close()
    lines = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert [x["outcome"] for x in lines] == ["held:raised", "held:garbage", "held:timeout;fallback",
                                             "unchanged", "unchanged"]
    assert [x["policy"] for x in lines] == ["scripted-bad"] * 3 + ["static"] * 2
    assert dict(stats.failures) == {"raised": 1, "timeout": 1, "garbage": 1} and stats.fallbacks == 1
    assert _limits(gw) == before and len(gw.audit_log()) == audit_before  # nothing was applied
    assert all(x["limits_after"] == x["limits_before"] == before for x in lines)
    assert lines[0]["observation"]["tenants"]["bursty"]["limit"] == 3


def test_a_held_decision_changes_nothing_where_a_decision_of_zeros_would_clamp(gw: GatewayProcess,
                                                                              tmp_path: Path) -> None:
    """The gateway holds limits above the spec's bounds: while the policy fails they stay as they are (a held
    decision is no decision), and the fallback's first decision, zeros, brings them into the bounds."""
    from dataclasses import replace

    assert _limits(gw) == {"bursty": 3, "steady": 3}
    spec = _spec(gw, 0.2)
    spec = replace(spec, limits=replace(spec.limits, max=2, initial=2))
    own = GatewayClient(gw.url, ADMIN_TOKEN, timeout_s=20, actor="held-test")  # apart from admit-control's audit
    loop = ControlLoop(own, Scripted(["raise"]), spec, act_timeout_s=2.0, max_failures=2,
                       fallback=make_controller("static"), log_path=tmp_path / "decisions.jsonl")
    try:
        stats = loop.run(steps=3)
    finally:
        loop.close()
        after = _limits(gw)
        own.set_limits({"bursty": 3, "steady": 3}, "test reset")
    lines = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert [x["outcome"] for x in lines] == ["held:raised", "held:raised;fallback", "applied"]
    assert [x["limits_after"]["bursty"] for x in lines] == [3, 3, 2] and [x["deltas"] for x in lines] == [
        None, None, [0, 0]]
    assert after == {"bursty": 2, "steady": 2} and stats.applied == 1 and stats.failures == {"raised": 2}


def test_an_llm_whose_endpoint_fails_every_call_falls_back_to_static(gw: GatewayProcess, tmp_path: Path) -> None:
    """The LLM policy never raises (it holds), so only its ``last_failure`` lets the loop see the failures."""
    before, audit_before = _limits(gw), len(gw.audit_log())
    with ScriptedServer(default=Step(status=500)) as server:
        policy = LLMPolicy(LLMConfig(base_url=server.base_url, timeout_s=10.0))
        # deadlines only bound a hang: the scripted server answers at once
        loop = ControlLoop(client(gw), policy, _spec(gw, 0.2), act_timeout_s=20.0, max_failures=3,
                           fallback=make_controller("static"), log_path=tmp_path / "decisions.jsonl")
        try:
            stats = loop.run(steps=5)
        finally:
            loop.close()
            policy.close()
        calls = len(server.requests)
    lines = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert [x["outcome"] for x in lines] == ["held:policy:http_error"] * 2 + [
        "held:policy:http_error;fallback", "unchanged", "unchanged"]
    assert [x["policy"] for x in lines] == ["llm"] * 3 + ["static"] * 2
    assert dict(stats.failures) == {"policy:http_error": 3} and stats.fallbacks == 1
    assert lines[-1]["failures"] == {"policy:http_error": 3} and lines[0]["deltas"] is None
    assert calls == 3 and dict(policy.stats.holds) == {"http_error": 3}  # one call per decision, then static
    assert _limits(gw) == before and len(gw.audit_log()) == audit_before


def test_admit_control_reports_an_llm_that_answers_garbage(gw: GatewayProcess, tmp_path: Path) -> None:
    """`admit control --policy llm:URL`: the summary line and the decision log name ``policy:bad_response``."""
    before = _limits(gw)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADMIT_LLM_")}  # only the URL given here
    env["ADMIT_ADMIN_TOKEN"] = ADMIN_TOKEN
    with ScriptedServer(default=Step(raw_body=b"<html>proxy error</html>")) as server:
        out = subprocess.run(
            [str(Path(sys.executable).parent / "admit"), "control", "--gateway", gw.url, "--policy",
             f"llm:{server.base_url}", "--interval", "200ms", "--scenario", "seed-paper", "--steps", "3",
             "--max-failures", "2", "--log", str(tmp_path / "d.jsonl"), "--act-timeout", "20s"],
            capture_output=True, text=True, env=env, timeout=90,
        )
        calls = len(server.requests)
    assert out.returncode == 0, out.stderr
    assert "decisions 3, applied 0, unchanged 1" in out.stdout
    assert "failures {'policy:bad_response': 2}, fallbacks 1" in out.stdout
    assert "could not decide: bad_response" in out.stderr  # the warning
    lines = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [x["outcome"] for x in lines] == ["held:policy:bad_response", "held:policy:bad_response;fallback",
                                             "unchanged"]
    assert calls == 2 and _limits(gw) == before


def test_shadow_mode_changes_nothing(gw: GatewayProcess, tmp_path: Path) -> None:
    before, audit_before = _limits(gw), len(gw.audit_log())
    # the default deadline is half the interval, 50 ms here: too short for a loaded machine, and not what this
    # test is about
    loop = ControlLoop(client(gw), make_controller("static:1"), _spec(gw, 0.1), shadow=True, act_timeout_s=5.0,
                       log_path=tmp_path / "shadow.jsonl")
    try:
        stats = loop.run(steps=3)
    finally:
        loop.close()
    lines = [json.loads(x) for x in (tmp_path / "shadow.jsonl").read_text().splitlines()]
    assert [x["outcome"] for x in lines] == ["shadow"] * 3 and stats.shadow == 3 and stats.applied == 0
    assert lines[0]["deltas"] == [-1, -1] and lines[0]["limits_after"] == {"bursty": 2, "steady": 2}
    assert _limits(gw) == before and len(gw.audit_log()) == audit_before


def test_admit_control_applies_a_good_policy_through_the_audit_log(gw: GatewayProcess, tmp_path: Path) -> None:
    env = {**os.environ, "ADMIT_ADMIN_TOKEN": ADMIN_TOKEN}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "admit"), "control", "--gateway", gw.url, "--policy", "static:1",
         "--interval", "200ms", "--scenario", "seed-paper", "--steps", "3", "--log", str(tmp_path / "d.jsonl"),
         "--act-timeout", "5s"],  # the default, half the interval (0.1 s), is too short for a loaded machine
        capture_output=True, text=True, env=env, timeout=90,
    )
    assert out.returncode == 0, out.stderr
    assert "decisions 3, applied 2, unchanged 1" in out.stdout
    assert _limits(gw) == {"bursty": 1, "steady": 1}
    mine = [x for x in gw.audit_log() if x["actor"] == "admit-control"]
    assert [(x["tenant"], x["old"], x["new"], x["reason"]) for x in mine] == [
        ("bursty", 3, 2, "static:1 decision 1"), ("steady", 3, 2, "static:1 decision 1"),
        ("bursty", 2, 1, "static:1 decision 2"), ("steady", 2, 1, "static:1 decision 2")]
    assert len({x["version"] for x in mine}) == 2  # each decision is one atomic batch
    assert client(gw).set_limits({"bursty": 3, "steady": 3}, "test reset")["tenants"]["bursty"]["limit"] == 3


def test_admit_control_refuses_a_calibration_it_cannot_bind_and_changes_nothing(gw: GatewayProcess,
                                                                                tmp_path: Path) -> None:
    cal = Path(__file__).parents[2] / "docs" / "results" / "cpu-smollm2-avx512bf16-calibration.json"
    env = {**os.environ, "ADMIT_ADMIN_TOKEN": ADMIN_TOKEN}
    before, audit_before = _limits(gw), len(gw.audit_log())
    base = [str(Path(sys.executable).parent / "admit"), "control", "--gateway", gw.url, "--policy", "static:1",
            "--steps", "1", "--calibration", str(cal)]
    for extra, needle in (([], "give --scenario"), (["--scenario", "seed-paper"], "seed-paper has a slot engine")):
        out = subprocess.run([*base, *extra], capture_output=True, text=True, env=env, timeout=90)
        assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert _limits(gw) == before and len(gw.audit_log()) == audit_before

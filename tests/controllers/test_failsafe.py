"""The fail-safe (controllers/failsafe.py): a wrapping controller that holds on every kind of policy failure and
falls back after ``max_failures`` in a row, so that the one decision loop (core/loop.py) needs no failure
handling of its own. tests/live/test_gateway_control.py runs it in the live loop against a real gateway."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
from admit.controllers.failsafe import FailSafe
from admit.controllers.static import StaticController
from admit.core.loop import run_loop
from admit.core.observation import Observation
from admit.core.spec import ControlSpec
from admit.envs.scenario import load_scenario
from admit.envs.simulation import SimulatedWorld, Simulation

SC = load_scenario("seed-paper", horizon_s=60)


class Scripted:
    """A policy that behaves in turn as scripted: ``ok`` (-1 for every tenant), ``raise``, ``garbage``,
    ``sleep`` (far past any deadline, until the test wakes it) or ``hold:REASON`` (zeros, with ``last_failure``)."""

    name = "scripted"

    def __init__(self, script: Sequence[str]) -> None:
        self.script = list(script)
        self.calls = 0
        self.wake = threading.Event()
        self.last_failure: str | None = None

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.n = spec.n_tenants

    def act(self, obs: Observation) -> list[int]:
        what = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        self.last_failure = what.removeprefix("hold:") if what.startswith("hold:") else None
        if what == "raise":
            raise RuntimeError("scripted failure")
        if what == "garbage":
            return [7, "x"]  # type: ignore[list-item]
        if what == "sleep":
            self.wake.wait(60.0)
        return [0] * self.n if self.last_failure else [-1] * self.n


@pytest.fixture
def obs() -> Observation:
    return Simulation(SC, 0).observe()


@contextmanager
def _wrapped(script: Sequence[str], **kw: float) -> Iterator[tuple[FailSafe, Scripted]]:
    policy = Scripted(script)
    fs = FailSafe(policy, StaticController(), act_timeout_s=kw.get("act_timeout_s", 2.0),
                  max_failures=int(kw.get("max_failures", 3)))
    fs.reset(SC.control_spec(), 0)
    try:
        yield fs, policy
    finally:
        policy.wake.set()
        fs.close()


def test_every_kind_of_failure_holds_and_the_third_in_a_row_falls_back(obs: Observation) -> None:
    with _wrapped(["raise", "garbage", "sleep", "ok"]) as (fs, policy):
        seen = [(list(fs.act(obs)), fs.held, fs.fell_back, fs.decided_by) for _ in range(5)]
        assert seen == [([0, 0], "raised", False, "scripted"), ([0, 0], "garbage", False, "scripted"),
                        ([0, 0], "timeout", True, "scripted"), ([0, 0], None, False, "static"),
                        ([0, 0], None, False, "static")]  # static holds the limits
        assert dict(fs.failures) == {"raised": 1, "garbage": 1, "timeout": 1} and fs.fallbacks == 1
        assert fs.name == "static" and policy.calls == 3  # the policy is not asked again


def test_a_good_answer_passes_through_and_resets_the_count(obs: Observation) -> None:
    with _wrapped(["raise", "raise", "ok", "raise", "raise", "hold:http_error"]) as (fs, _):
        got = [(list(fs.act(obs)), fs.held) for _ in range(6)]
        assert got == [([0, 0], "raised"), ([0, 0], "raised"), ([-1, -1], None), ([0, 0], "raised"),
                       ([0, 0], "raised"), ([0, 0], "policy:http_error")]
        assert fs.fallbacks == 1 and fs.fell_back and fs.consecutive_failures == 0


def test_a_call_past_its_deadline_is_not_asked_again_while_it_runs(obs: Observation) -> None:
    with _wrapped(["sleep"], act_timeout_s=0.2, max_failures=5) as (fs, policy):
        assert [(fs.act(obs), fs.held)[1] for _ in range(3)] == ["timeout", "busy", "busy"]
        assert policy.calls == 1


def test_the_one_loop_drives_a_wrapped_policy_in_the_simulator() -> None:
    """A policy that raises at every decision stops no run: every decision holds until static takes over."""
    with _wrapped(["raise"]) as (fs, _):
        sim = Simulation(SC, 3)
        stats = run_loop(SimulatedWorld(sim), fs)
        assert stats.decisions == SC.horizon_s / SC.interval_s
        assert sim.limits == [SC.limits.initial] * 2 and stats.mean_limit == SC.limits.initial
        assert dict(fs.failures) == {"raised": 3} and fs.name == "static"


def test_bad_settings_and_an_act_before_reset_are_refused(obs: Observation) -> None:
    with pytest.raises(ValueError, match="act_timeout_s must be > 0, got 0"):
        FailSafe(StaticController(), act_timeout_s=0)
    with pytest.raises(ValueError, match="max_failures must be >= 1, got 0"):
        FailSafe(StaticController(), act_timeout_s=1.0, max_failures=0)
    fs = FailSafe(StaticController(), act_timeout_s=1.0)
    with pytest.raises(RuntimeError, match="FailSafe.act before reset"):
        fs.act(obs)
    fs.close()

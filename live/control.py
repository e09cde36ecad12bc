"""The live control loop: the gateway as a World of core/loop.py's one decision loop, and the decision log.

``GatewayWorld`` is the gateway in front of a real server as the loop's ``World``: observe is
``GET /admin/observation`` → `observation_from_json` (the simulator's layout, checked against the spec's
tenants); apply is new limits = ``ControlSpec.apply`` (current + delta, clamped to the bounds and each
tenant's ceiling) → ``PUT /admin/limits`` as one atomic batch (actor ``admit-control``, so the gateway's
audit log names the loop and the policy), or nothing when no limit changes; and time advances on the loop's
schedule: a fixed phase of ``interval_s`` ticks (a decision that overruns skips the missed ticks), from the
first request when started on traffic. The SLO features are the spec's, the objectives the policy was reset
with.

``ControlLoop`` drives it with the policy wrapped in ``FailSafe`` (controllers/failsafe.py): a policy that
raises, misses its deadline (``act_timeout_s``), returns garbage or reports that it could not decide is held
— the gateway is not touched, the last good limits stay — and after ``max_failures`` consecutive failures the
fallback policy (``static``: hold the limits) takes over for good.

**Shadow mode** does everything but the PUT: decisions are logged, the gateway is not touched.

Every decision is one JSONL line (time, observation summary, deltas, limits before/after, outcome, policy,
the failures by kind and the fallbacks so far); outcomes: ``applied``, ``unchanged``, ``shadow``,
``apply-error: …``, ``held:<failure>`` (``;fallback`` when that failure switched to the fallback), and
``fetch-error`` for a tick whose observation could not be read (no decision is made).
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from admit.controllers.failsafe import FailSafe
from admit.core.controller import Controller
from admit.core.loop import run_loop
from admit.core.observation import Observation
from admit.core.spec import ControlSpec
from admit.core.wire import observation_from_json
from admit.gateway.jsonl import JsonlWriter

log = logging.getLogger("admit.control")
ACTOR = "admit-control"


class GatewayClient:
    """The admin API, over plain HTTP with a bearer token."""

    def __init__(self, url: str, token: str, timeout_s: float = 10.0, actor: str = ACTOR) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.actor = actor

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json", "x-admit-actor": self.actor})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"{method} {path}: HTTP {err.code} {err.read()[:300]!r}") from None

    def spec(self) -> dict[str, Any]:
        return self.call("GET", "/admin/spec")

    def observation(self) -> dict[str, Any]:
        return self.call("GET", "/admin/observation")

    def set_limits(self, limits: dict[str, int], reason: str) -> dict[str, Any]:
        return self.call("PUT", "/admin/limits", {"limits": limits, "reason": reason})


@dataclass
class LoopStats:
    decisions: int = 0
    applied: int = 0
    unchanged: int = 0
    shadow: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # raised, timeout, busy, garbage, policy:<reason>
    consecutive_failures: int = 0
    fallbacks: int = 0
    fetch_errors: int = 0
    apply_errors: int = 0


class GatewayWorld:
    """The gateway's admin API as core/loop.py's ``World``, driven with ``policy`` (a ``FailSafe``: a decision
    it held changes nothing, not even a limit the gateway holds outside the spec's bounds; the PUT's reason
    names the policy that decided and the decision's number). ``schedule`` sets how many decisions a run makes
    and how it sleeps; ``on_fetch_error(time, error)`` hears of a tick whose observation could not be read."""

    def __init__(self, client: GatewayClient, spec: ControlSpec, policy: FailSafe, *, shadow: bool = False,
                 start_on_traffic: bool = False, traffic_poll_s: float = 0.01,
                 on_fetch_error: Callable[[float, Exception], None] | None = None) -> None:
        self.client = client
        self.spec = spec
        self.policy = policy
        self.shadow = shadow
        self.start_on_traffic = start_on_traffic
        self.traffic_poll_s = traffic_poll_s
        self.on_fetch_error = on_fetch_error
        self.names = [t.name for t in spec.tenants]
        self.traffic_t0: float | None = None  # time.monotonic() of the first arrival, when started on traffic
        self.steps: int | None = None
        self.sleep: Callable[[float], Any] = time.sleep
        self.ticks = 0
        self.next_at = time.monotonic()
        self.decisions = 0
        self.data: dict[str, Any] = {}  # the admin API's last answer (its telemetry goes in the decision log)
        self.observed_at = 0.0  # time.monotonic() when the last observation was asked for
        self.before: list[int] = []  # the limits the last observation saw
        self.outcome = ""  # what the last apply did: applied, unchanged, shadow, apply-error: …, held

    def schedule(self, steps: int | None, sleep: Callable[[float], Any] = time.sleep) -> None:
        """Start a run of ``steps`` decisions (None: until stopped) on a schedule that starts now."""
        self.steps, self.sleep, self.ticks, self.next_at = steps, sleep, 0, time.monotonic()

    @property
    def now(self) -> float:
        return time.time()

    def due(self) -> bool:
        return self.steps is None or self.ticks < self.steps

    def observe(self) -> Observation | None:
        t, self.observed_at = time.time(), time.monotonic()
        try:
            self.data = self.client.observation()
            obs = observation_from_json(self.data, self.spec)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            if self.on_fetch_error is not None:
                self.on_fetch_error(t, exc)
            return None
        self.before = [int(x.limit) for x in obs.tenants]
        return obs

    def apply(self, deltas: list[int]) -> list[int]:
        self.decisions += 1
        before = self.before
        if self.policy.held is not None:
            self.outcome = "held"
            return before
        after = self.spec.apply(before, deltas)  # within each tenant's ceiling (Kueue's quota) too
        changes = {n: a for n, a, b in zip(self.names, after, before, strict=True) if a != b}
        if self.shadow:
            self.outcome = "shadow"
        elif not changes:
            self.outcome = "unchanged"
        else:
            try:
                self.client.set_limits(changes, f"{self.policy.decided_by} decision {self.decisions}")
                self.outcome = "applied"
            except (OSError, RuntimeError) as exc:
                self.outcome = f"apply-error: {str(exc)[:200]}"
        return after

    def advance(self) -> None:
        """Wait for the next tick: ``interval_s`` after the last on a fixed phase (a decision that overran its
        interval skips the missed ticks), none after the run's last decision. Started on traffic, the first
        decision is made at once (on an idle gateway, as the simulator's at t = 0 sees no arrivals yet) and
        the next ones ``interval_s``, 2 ``interval_s``, ... after the first request arrives: the simulator's
        schedule, whose clock starts with its first arrival."""
        self.ticks += 1
        interval = self.spec.interval_s
        if self.ticks == 1 and self.start_on_traffic:
            self.traffic_t0 = self.wait_for_traffic()
            self.next_at = self.traffic_t0 + interval
            delay = self.next_at - time.monotonic()
            if delay > 0 and self.due():
                self.sleep(delay)
            return
        self.next_at += interval
        now = time.monotonic()
        if self.next_at <= now:  # a decision overran its interval: skip the missed ticks, keep the schedule's phase
            self.next_at += math.ceil((now - self.next_at) / interval + 1e-9) * interval
        if self.due():
            self.sleep(self.next_at - now)

    def wait_for_traffic(self) -> float:
        """Poll the Observation until a request has arrived; returns when it arrived (``time.monotonic()``).

        It arrived after the gateway built the last observation with no arrivals and before it built the
        first one with some: the midpoint of those two calls, within half a poll (plus the round trips).
        """
        log.info("waiting for the first request at the gateway")
        last_empty = time.monotonic()
        while True:
            sent = time.monotonic()
            try:
                data = self.client.observation()
                arrived = sum(t["arrivals"] + t["completions"] for t in data["observation"]["tenants"])
            except (OSError, RuntimeError, ValueError, KeyError, TypeError):
                arrived = 0  # not up, or an answer we cannot read: keep polling
            got = time.monotonic()
            if arrived > 0:
                return (last_empty + got) / 2
            last_empty = sent
            self.sleep(self.traffic_poll_s)


class ControlLoop:
    """``policy`` (behind ``FailSafe``) deciding for the gateway every ``spec.interval_s``, each decision
    logged to ``log_path`` (JSONL) and counted in ``stats``."""

    def __init__(self, client: GatewayClient, policy: Controller, spec: ControlSpec, *, shadow: bool = False,
                 act_timeout_s: float | None = None, max_failures: int = 3, fallback: Controller | None = None,
                 log_path: Path | None = None, seed: int = 0, start_on_traffic: bool = False,
                 traffic_poll_s: float = 0.01) -> None:
        self.spec = spec
        timeout = act_timeout_s if act_timeout_s is not None else max(0.05, spec.interval_s / 2)
        self.failsafe = FailSafe(policy, fallback, act_timeout_s=timeout, max_failures=max_failures)
        self.failsafe.reset(spec, seed)
        self.world = GatewayWorld(client, spec, self.failsafe, shadow=shadow, start_on_traffic=start_on_traffic,
                                  traffic_poll_s=traffic_poll_s, on_fetch_error=self._fetch_error)
        self.stats = LoopStats(failures=self.failsafe.failures)
        self.log = JsonlWriter(log_path)
        self.names = self.world.names
        self.last: dict[str, Any] = {}

    @property
    def policy(self) -> Controller:
        """The policy deciding now (the fallback once it took over)."""
        return self.failsafe.policy

    @property
    def traffic_t0(self) -> float | None:
        return self.world.traffic_t0

    def close(self) -> None:
        self.failsafe.close()
        self.log.close()

    def run(self, steps: int | None = None, sleep: Any = time.sleep) -> LoopStats:
        """Decide ``steps`` times (None: until interrupted) on the gateway's schedule (``GatewayWorld.advance``:
        a fixed phase of ``interval_s``, from the first request with ``start_on_traffic``)."""
        self.world.schedule(steps, sleep)
        run_loop(self.world, self.failsafe, on_decision=self._decided)
        return self.stats

    def _fetch_error(self, t: float, exc: Exception) -> None:
        self.stats.fetch_errors += 1
        self.log.write({"time": round(t, 3), "outcome": "fetch-error", "error": str(exc)[:300],
                        "policy": self.failsafe.name})

    def _decided(self, t: float, obs: Observation, deltas: list[int], after: list[int]) -> None:
        s, fs, world = self.stats, self.failsafe, self.world
        s.decisions += 1
        s.consecutive_failures, s.fallbacks = fs.consecutive_failures, fs.fallbacks
        if fs.held is not None:
            outcome = f"held:{fs.held}" + (";fallback" if fs.fell_back else "")
        else:
            outcome = world.outcome
            if outcome == "shadow":
                s.shadow += 1
            elif outcome == "unchanged":
                s.unchanged += 1
            elif outcome == "applied":
                s.applied += 1
            else:
                s.apply_errors += 1
        line = {
            "time": round(t, 3),
            **({} if world.traffic_t0 is None else {"since_traffic_s": round(world.observed_at - world.traffic_t0, 3)}),
            "decision": s.decisions,
            "policy": fs.decided_by,
            "observation": observation_summary(obs, self.names, world.data.get("telemetry", {})),
            "deltas": None if fs.held is not None else deltas,
            "limits_before": dict(zip(self.names, world.before, strict=True)),
            "limits_after": dict(zip(self.names, after, strict=True)),
            "outcome": outcome,
            "failures": dict(s.failures),
            "fallbacks": s.fallbacks,
        }
        self.log.write(line)
        self.last = line


def observation_summary(obs: Observation, names: list[str], telemetry: dict[str, Any]) -> dict[str, Any]:
    """The decision log's view of an Observation (also what `admit sim2live` logs for the simulator's decisions)."""
    return {
        "time_s": round(obs.time_s, 3),
        "gpu_mem_util": round(obs.gpu_mem_util, 4),
        "engine_running": obs.engine_running,
        "engine_waiting": obs.engine_waiting,
        "stale": telemetry.get("stale"),
        "tenants": {n: {"queue_depth": t.queue_depth, "in_flight": t.in_flight, "limit": t.limit,
                        "arrivals": t.arrivals, "completions": t.completions, "drops": t.drops,
                        "rejections": t.rejections, "e2e_p99": round(t.e2e_p99, 4), "ttft_p99": round(t.ttft_p99, 4),
                        "queue_wait_p99": round(t.queue_wait_p99, 4)} for n, t in zip(names, obs.tenants, strict=True)},
    }

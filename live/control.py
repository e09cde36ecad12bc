"""The live control loop: every interval read the gateway's Observation, ask the policy, clamp, apply.

One decision: ``GET /admin/observation`` → `Observation.from_vector` (the simulator's layout, checked
against the spec's tenants) → ``policy.act(obs)`` in a worker thread with a deadline → `validate_deltas`
→ new limits = clamp(current + delta) → ``PUT /admin/limits`` as one atomic batch (actor
``admit-control``, so the gateway's audit log names the loop and the policy). The SLO features are the
spec's, the objectives the policy was reset with.

**Shadow mode** does everything but the PUT: decisions are logged, the gateway is not touched.

**Fail-safe.** A policy that raises, misses the deadline (``act_timeout_s``; a call still running at the
next tick counts again and is not re-entered), returns garbage (wrong length, not integers, beyond
±max_step) or reports that it could not decide (``last_failure``, core/controller.py: the LLM policy
holds when its model times out or answers nonsense, and says why; counted as ``policy:<reason>``) changes
nothing — the last good limits stay as they are — and after ``max_failures`` consecutive failures the loop
switches to the fallback policy (``static``: hold the limits) for good. Failures are counted by kind;
every decision is one JSONL line (time, observation summary, deltas, limits before/after, outcome, policy).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from admit.core.controller import Controller, policy_failure, validate_deltas
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


read_observation = observation_from_json  # the name this module exported before core/wire.py had it


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


class ControlLoop:
    def __init__(self, client: GatewayClient, policy: Controller, spec: ControlSpec, *, shadow: bool = False,
                 act_timeout_s: float | None = None, max_failures: int = 3, fallback: Controller | None = None,
                 log_path: Path | None = None, seed: int = 0, start_on_traffic: bool = False,
                 traffic_poll_s: float = 0.01) -> None:
        self.client = client
        self.spec = spec
        self.shadow = shadow
        self.start_on_traffic = start_on_traffic
        self.traffic_poll_s = traffic_poll_s
        self.traffic_t0: float | None = None  # time.monotonic() of the first arrival, when started on traffic
        self.act_timeout_s = act_timeout_s if act_timeout_s is not None else max(0.05, spec.interval_s / 2)
        self.max_failures = max_failures
        self.fallback = fallback
        self.stats = LoopStats()
        self.log = JsonlWriter(log_path)
        self.seed = seed
        self.policy = policy
        self.policy.reset(spec, seed)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="policy")
        self._pending: concurrent.futures.Future[Any] | None = None
        self.names = [t.name for t in spec.tenants]
        self.last: dict[str, Any] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.log.close()

    # ----------------------------------------------------------------- one decision
    def _ask(self, obs: Observation) -> tuple[list[int] | None, str]:
        """The policy's validated deltas, or None and the kind of failure."""
        if self._pending is not None and not self._pending.done():
            return None, "busy"  # the last call is still running past its deadline: do not pile calls up
        self._pending = self._pool.submit(self.policy.act, obs)
        try:
            raw = self._pending.result(timeout=self.act_timeout_s)
        except concurrent.futures.TimeoutError:
            return None, "timeout"
        except Exception as exc:
            log.warning("policy %s raised %s: %s", self.policy.name, type(exc).__name__, exc)
            return None, "raised"
        try:
            deltas = validate_deltas(list(raw) if not isinstance(raw, list) else raw, self.spec)
            reason = policy_failure(self.policy)  # read after act() returned: no other call is running
        except (TypeError, ValueError) as exc:
            log.warning("policy %s returned garbage: %s", self.policy.name, str(exc)[:200])
            return None, "garbage"
        if reason is not None:  # it held because it could not decide (an LLM that did not answer): a failure
            log.warning("policy %s could not decide: %s", self.policy.name, reason[:200])
            return None, f"policy:{reason[:64]}"
        return deltas, ""

    def step(self) -> dict[str, Any]:
        s = self.stats
        t, mono = time.time(), time.monotonic()
        try:
            data = self.client.observation()
            obs = read_observation(data, self.spec)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            s.fetch_errors += 1
            line = {"time": round(t, 3), "outcome": "fetch-error", "error": str(exc)[:300], "policy": self.policy.name}
            self.log.write(line)
            return line
        s.decisions += 1
        before = [int(x.limit) for x in obs.tenants]
        deltas, failure = self._ask(obs)
        policy_name = self.policy.name
        after = before
        if deltas is None:
            s.failures[failure] += 1
            s.consecutive_failures += 1
            outcome = f"held:{failure}"
            if s.consecutive_failures >= self.max_failures and self.fallback is not None:
                log.warning("policy %s failed %d times in a row: falling back to %s", policy_name,
                            s.consecutive_failures, self.fallback.name)
                self.policy, self.fallback = self.fallback, None
                self.policy.reset(self.spec, self.seed)
                self._pool.shutdown(wait=False, cancel_futures=True)  # a call stuck past its deadline stays behind
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="policy")
                self._pending = None
                s.fallbacks += 1
                s.consecutive_failures = 0
                outcome += ";fallback"
        else:
            s.consecutive_failures = 0
            after = self.spec.apply(before, deltas)  # within each tenant's ceiling (Kueue's quota) too
            changes = {n: a for n, a, b in zip(self.names, after, before, strict=True) if a != b}
            if self.shadow:
                s.shadow += 1
                outcome = "shadow"
            elif not changes:
                s.unchanged += 1
                outcome = "unchanged"
            else:
                try:
                    self.client.set_limits(changes, f"{policy_name} decision {s.decisions}")
                    s.applied += 1
                    outcome = "applied"
                except (OSError, RuntimeError) as exc:
                    s.apply_errors += 1
                    outcome = f"apply-error: {str(exc)[:200]}"
        line = {
            "time": round(t, 3),
            **({} if self.traffic_t0 is None else {"since_traffic_s": round(mono - self.traffic_t0, 3)}),
            "decision": s.decisions,
            "policy": policy_name,
            "observation": observation_summary(obs, self.names, data.get("telemetry", {})),
            "deltas": deltas,
            "limits_before": dict(zip(self.names, before, strict=True)),
            "limits_after": dict(zip(self.names, after, strict=True)),
            "outcome": outcome,
            "failures": dict(s.failures),
            "fallbacks": s.fallbacks,
        }
        self.log.write(line)
        self.last = line
        return line

    def wait_for_traffic(self, sleep: Any = time.sleep) -> float:
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
            sleep(self.traffic_poll_s)

    def run(self, steps: int | None = None, sleep: Any = time.sleep) -> LoopStats:
        """Decide every ``interval_s`` (on a fixed schedule, not drifting with the decision's own time).

        ``start_on_traffic``: the first decision is made at once (on an idle gateway, as the simulator's at
        t = 0 sees no arrivals yet), the next ones at ``interval_s``, 2 ``interval_s``, ... after the first
        request arrives — the simulator's schedule, whose clock starts with its first arrival. Otherwise
        the schedule starts when the loop does.
        """
        next_at = time.monotonic()
        n = 0
        if self.start_on_traffic and (steps is None or steps > 0):
            self.step()
            n = 1
            self.traffic_t0 = self.wait_for_traffic(sleep)
            next_at = self.traffic_t0 + self.spec.interval_s
            delay = next_at - time.monotonic()
            if delay > 0 and (steps is None or n < steps):
                sleep(delay)
        while steps is None or n < steps:
            self.step()
            n += 1
            next_at += self.spec.interval_s
            now = time.monotonic()
            if next_at <= now:  # a decision overran its interval: skip the missed ticks, keep the schedule's phase
                next_at += math.ceil((now - next_at) / self.spec.interval_s + 1e-9) * self.spec.interval_s
            if steps is None or n < steps:
                sleep(next_at - now)
        return self.stats


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

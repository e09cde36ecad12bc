"""Robust admission controller built on the study's four requirements (each switchable, for ablations).

(1) confidence — congestion is judged from a longer history with a confidence bound, not one window's p99.
    Per tenant and objective (TTFT and/or e2e p99), ``MissHistory`` (controllers/slo_bound.py) estimates
    the share of requests over the objective across the last ``history_s`` seconds and a Wilson interval
    on it. A tenant is *at risk* only when the lower bound exceeds 1 − q (the p99 is over the SLO with
    95% confidence). Off (``confidence=False``): at risk when the window's p99 exceeds the SLO.
(2) per tenant — each tenant is judged on its own backlog, queue wait and SLO slack: the engine is
    *congested* when the server is saturated (``engine_waiting ≥ 5``, or KV usage ≥ 0.8 with requests
    waiting in the engine) or a tenant is at risk although its own admission wait is small (the engine,
    not its limit, makes it slow). Then only *donors* are throttled; tenants with a backlog grow.
    Off (``per_tenant=False``): one global decision moves every limit together.
(3) asymmetric costs — under a hard queue timeout a throttle turns into drops, so: a tenant whose queue
    wait reaches ``urgent_frac`` of the timeout goes up by max_step at once; a donor is throttled only
    while its queue wait is below ``safe_frac`` of the timeout, by ``down_step`` (1) at a time, at most
    once per ``hold_s``; growth on a backlog is max_step. Off: ±max(1, max_step // 2) both ways, no hold,
    no timeout guard.
(4) context — donors are the tenants with SLO slack (smoothed window p99 / SLO < ``slack_margin``, or no
    objective) and the tenants in a burst (arrival-rate EMA over ~``fast_s`` > ``burst_ratio`` × the EMA
    over ~``slow_s``), restricted to the lowest spec priority among them; a bursting donor is paced by
    ``burst_step`` (max_step) per decision, since its burst is what congests the server. Off: every
    tenant is a donor, priorities and bursts are ignored.
(5) interference — growth on a backlog (max_step) only while the server is not slow for everyone: a
    backlog behind an inflated server (service time e2e_p50 − ttft_p50 ≥ ``inflation_high`` × each
    tenant's own unloaded baseline, controllers/inflation.py) is not fixed by admitting more — the extra
    prefill slows every decode, and the p99 of the long decodes is the tail. Then only the timeout guard
    of (3) raises a limit. Off (``interference=False``): a backlog grows whatever the server's speed.
Inputs: per-tenant queue_depth, queue_wait_p99, arrivals, completions, ttft/e2e p50/p95/p99 and SLOs;
global engine_waiting and gpu_mem_util. Deterministic; no randomness.
"""

from __future__ import annotations

import math

from admit.controllers.inflation import ServiceInflation
from admit.controllers.slo_bound import MissHistory, share_above
from admit.core.observation import NO_SLO, Observation
from admit.core.spec import ControlSpec


class RobustController:
    name = "robust"

    def __init__(self, confidence: bool = True, per_tenant: bool = True, asymmetric: bool = True,
                 context: bool = True, history_s: float = 60.0, z: float = 1.645, quantile: float = 0.99,
                 urgent_frac: float = 0.5, safe_frac: float = 0.25, hold_s: float = 10.0, down_step: int = 1,
                 slack_margin: float = 0.5, burst_ratio: float = 2.0, fast_s: float = 6.0, slow_s: float = 120.0,
                 memory_s: float = 300.0, pace_headroom: float = 2.0, waiting_high: float = 5.0,
                 kv_high: float = 0.8, interference: bool = True, inflation_high: float = 3.0) -> None:
        self.confidence, self.per_tenant, self.asymmetric, self.context = confidence, per_tenant, asymmetric, context
        self.interference, self.inflation_high = interference, inflation_high
        self.history_s, self.z, self.miss_ok = history_s, z, 1.0 - quantile
        self.urgent_frac, self.safe_frac, self.hold_s, self.down_step = urgent_frac, safe_frac, hold_s, down_step
        self.slack_margin, self.burst_ratio, self.fast_s, self.slow_s = slack_margin, burst_ratio, fast_s, slow_s
        self.memory_s, self.pace_headroom = memory_s, pace_headroom
        self.waiting_high, self.kv_high = waiting_high, kv_high

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec, n = spec, spec.n_tenants
        self.slos = [[(k, s) for k, s in (("ttft", t.slo_ttft_p99_s), ("e2e", t.slo_e2e_p99_s)) if s < NO_SLO]
                     for t in spec.tenants]
        self.hist = [{k: MissHistory(self.history_s) for k, _ in slos} for slos in self.slos]
        self.fresh = min(1.0, spec.interval_s / spec.window_s) if spec.window_s > 0 else 1.0
        self.a_fast, self.a_slow = min(1.0, spec.interval_s / self.fast_s), min(1.0, spec.interval_s / self.slow_s)
        self.rate_fast, self.rate_slow = [0.0] * n, [0.0] * n
        self.ratio = [0.0] * n  # smoothed window p99 / SLO, the slack signal
        self.next_down = [0.0] * n
        self.bursty_until = [-math.inf] * n  # a tenant that burst recently is paced while others suffer
        self.first = True
        self.busy = [0.0] * n  # EMA of in-flight requests: the concurrency the tenant needs on average
        self.timeout = spec.queue_timeout_s if math.isfinite(spec.queue_timeout_s) else math.inf
        self.inflation = ServiceInflation(n)
        self.last_inflation = 1.0

    def _read(self, obs: Observation) -> tuple[list[bool], list[bool], list[bool], list[bool]]:
        risk, own, slack, burst = [], [], [], []
        for i, t in enumerate(obs.tenants):
            at_risk, worst = False, 0.0
            for kind, slo in self.slos[i]:
                p50, p95, p99 = (getattr(t, f"{kind}_p{q}") for q in (50, 95, 99))
                h = self.hist[i][kind]
                if t.samples > 0:
                    h.add(obs.time_s, t.completions * self.fresh, share_above(p50, p95, p99, slo))
                    worst = max(worst, p99 / slo)
                if kind != "ttft":  # e2e also grows with output length: throttling others cannot fix it
                    continue
                if self.confidence:  # (1) act on the bound, not the window
                    at_risk |= h.bounds(self.z)[0] > self.miss_ok
                else:
                    at_risk |= t.samples > 0 and p99 > slo
            if t.samples > 0:
                self.ratio[i] = 0.8 * self.ratio[i] + 0.2 * worst
            tight = min((s for _, s in self.slos[i]), default=math.inf)
            rate = t.arrivals / max(obs.window_s, 1e-9)
            if self.first:  # start the averages at the first reading, so start-up is not a "burst"
                self.rate_fast[i] = self.rate_slow[i] = rate
                self.busy[i] = t.in_flight
            self.rate_fast[i] += self.a_fast * (rate - self.rate_fast[i])
            self.rate_slow[i] += self.a_slow * (rate - self.rate_slow[i])
            risk.append(at_risk)
            own.append(t.queue_wait_p99 >= 0.5 * tight)
            slack.append(not self.slos[i] or self.ratio[i] < self.slack_margin)
            self.busy[i] += self.a_slow * (t.in_flight - self.busy[i])
            if self.rate_fast[i] > self.burst_ratio * max(self.rate_slow[i], 1.0 / max(obs.window_s, 1.0)):
                self.bursty_until[i] = obs.time_s + self.memory_s
            burst.append(obs.time_s < self.bursty_until[i])
        self.first = False
        return risk, own, slack, burst

    def act(self, obs: Observation) -> list[int]:
        risk, own, slack, burst = self._read(obs)
        if self.interference:  # (5) is the server slow for everyone? then more admissions only add to it
            self.last_inflation = self.inflation.update(obs)
        inflated = self.interference and self.last_inflation >= self.inflation_high
        k, n, now = self.spec.limits.max_step, obs.n_tenants, obs.time_s
        waiting = obs.engine_waiting
        saturated = waiting >= self.waiting_high or (obs.gpu_mem_util >= self.kv_high and waiting > 0)
        congested = saturated or any(r and not o for r, o in zip(risk, own, strict=True))
        up = k if self.asymmetric else max(1, k // 2)
        waits = [t.queue_wait_p99 for t in obs.tenants]
        urgent = [self.asymmetric and t.queue_depth > 0 and w >= self.urgent_frac * self.timeout
                  for t, w in zip(obs.tenants, waits, strict=True)]
        if not self.per_tenant:  # (2) off: one global signal for everybody
            if any(urgent):
                d = up
            elif congested:
                d = -(self.down_step if self.asymmetric else up)
            else:
                d = up if any(t.queue_depth > 0 for t in obs.tenants) and not inflated else 0
            return [d] * n
        if self.context:  # (4) donors: slack or bursting, lowest priority first
            cand = [i for i in range(n) if slack[i] or burst[i]]
            low = min((self.spec.tenants[i].priority for i in cand), default=0)
            donor = {i for i in cand if self.spec.tenants[i].priority == low}
        else:
            donor = set(range(n))
        # A recently bursty donor is paced on SLO pressure alone, down to pace_headroom × its average
        # concurrency (temporary, bounded by the timeout guard); a steady donor with slack is throttled only
        # when the server itself is saturated, one step per hold_s (that throttle lasts).
        lim = self.spec.limits
        out = []
        for i, t in enumerate(obs.tenants):
            safe = not self.asymmetric or waits[i] < self.safe_frac * self.timeout  # (3) far from the timeout
            paced = self.context and burst[i]
            floor = max(lim.min, math.ceil(self.pace_headroom * self.busy[i])) if paced else lim.min
            throttle = (congested and i in donor and safe and now >= self.next_down[i] and t.limit > floor
                        and (saturated or paced or not self.context))
            if urgent[i]:
                d = k
                self.next_down[i] = now + self.hold_s
            elif throttle:
                step = (k if paced else self.down_step) if self.asymmetric else up
                d = -min(step, int(t.limit) - floor)
                if self.asymmetric and not paced:
                    self.next_down[i] = now + self.hold_s
            elif t.queue_depth > 0 and not inflated and not (congested and i in donor):
                d = up
            else:
                d = 0
            out.append(d)
        return out

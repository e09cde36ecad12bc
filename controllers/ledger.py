"""Token-aware admission by a ledger: a footprint ledger, SLO feedback with confidence, weighted fair sharing.

What decides interference on a token engine is tokens, not requests: a long prompt holds the prefill budget
until its first token and the KV cache until its last (llm-d's capacity-ledger design notes; vLLM's
``--max-num-queued-tokens``; ../shared/reference/serving-metrics.md). Per decision, from Observation layout 2:

    footprint  f_i = tokens_in_flight_i / in_flight_i (EMA): prompt + generated tokens per request
    service    S_i ← δ·S_i + (1−δ)·(completions_i/window · f_i + 2·output_tokens_per_s_i) / w_i  (VTC's
               weighted tokens: an output token counts twice; δ: a 60 s half-life, as llm-d's fairness)
    KV size    K ← max(0.99·K, Σ_i tokens_in_flight_i / gpu_mem_util), read only when nothing waits in the
               engine (then every token in flight is in the cache)
    risk_i     Wilson lower bound (controllers/slo_bound.py, z = 1.645) on the share of tenant i's requests
               over its per-request TTFT or TPOT objective (from the window's percentiles, ``share_above``;
               TPOT's p95 interpolated) over ``history_s`` > ``miss_target``; own_i: its admission wait
               ≥ ``own_frac`` × its TTFT objective (its limit, not the engine, makes it slow)

1. A tenant at risk because of its own wait, or near its queue timeout, grows by max_step — unless the
   engine is saturated (engine_waiting ≥ 5, KV ≥ ``kv_high`` or preemptions) or another tenant is a victim.
2. Pressure (saturated, or a victim: at risk with a short own wait) is paid by the **donor**: the tenant
   with work in flight, not at risk, that has no TTFT/TPOT objective (it can wait) or else the most service
   S_i. Its limit goes toward ⌊(1 − ``cut``)·in_flight⌋ (at most max_step) and it cannot grow for
   ``hold_s``. The prefill budget P (∞ until the first pressure) becomes (1 − cut) × the prefill
   tokens outstanding, at most once per hold_s, and grows ×``p_grow`` per decision without pressure.
3. Otherwise backlogged tenants grow, least S_i first, while the ledgers have room: Δ requests of tenant
   i fit if Σ tokens_in_flight + Δ·f_i ≤ ``kv_target``·K and Σ prefill_tokens + Δ·p_i ≤ P (p_i: the mean
   prompt it has queued).

``ledger:best`` (static:best's caps as its anchors, controllers/around.py) treats the tuned caps as **quotas**
and lends above them, as Kueue's cohorts lend unused quota: it first walks to the quotas as static:best does;
a donor gives back only what it borrowed (never below its quota); lending needs every latency tenant *healthy*
— the Wilson upper bound of its miss share ≤ ``healthy_frac`` × miss_target over ≥ ``min_samples`` requests —
and the lent footprint Σ_i (limit_i − quota_i)⁺·f_i stays ≤ ``borrow_frac``·K, because a lent request comes
back only when it ends; an unused loan is returned (``cut_below=True``, an ablation, lets a tenant with no
TTFT/TPOT objective be cut below its quota too, and returns it after hold_s; ``own_excused`` leaves tenants
that miss at their own limit out of the health check, ``fresh_only`` then lends only to a queue whose wait is
under own_frac × its TTFT objective: docs/controllers.md measures all three). Without token features (slot
engine) f_i = 1 and the ledgers never bind. The lending defaults came from a first look at h200-mixed and
h200-azure-2023 in 600-900 s episodes on seeds 1000+ and were checked on family training instances
(h200-mix@2, @4, @6; docs/controllers.md has both). No randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from admit.controllers.common import tpot_p95, weighted_tokens_per_s
from admit.controllers.slo_bound import MissHistory, share_above
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec


class LedgerController:
    name = "ledger"

    def __init__(self, miss_target: float = 0.05, z: float = 1.645, history_s: float = 30.0,
                 kv_target: float = 0.85, kv_high: float = 0.95, cut: float = 0.25, hold_s: float = 10.0,
                 p_grow: float = 1.05, own_frac: float = 0.5, urgent_frac: float = 0.5,
                 half_life_s: float = 60.0, waiting_high: float = 5.0,
                 healthy_frac: float = 0.5, min_samples: float = 20.0, borrow_frac: float = 0.03,
                 cut_below: bool = False, own_excused: bool = False, fresh_only: bool = False) -> None:
        self.miss_target, self.z, self.history_s = miss_target, z, history_s
        self.kv_target, self.kv_high, self.cut, self.hold_s = kv_target, kv_high, cut, hold_s
        self.p_grow, self.own_frac, self.urgent_frac, self.half_life_s = p_grow, own_frac, urgent_frac, half_life_s
        self.waiting_high = waiting_high
        self.healthy_frac, self.min_samples, self.borrow_frac = healthy_frac, min_samples, borrow_frac
        self.cut_below = cut_below
        self.own_excused, self.fresh_only = own_excused, fresh_only

    def reset(self, spec: ControlSpec, seed: int | None = None, anchors: Sequence[int] | None = None) -> None:
        """Start an episode; ``anchors`` (per tenant), when given, are the quotas it lends above (ledger:best gets
        static:best's caps through controllers/around.py)."""
        self.spec, n = spec, spec.n_tenants
        self.latency = [math.isfinite(t.slo_ttft_s) or math.isfinite(t.slo_tpot_s) for t in spec.tenants]
        self.miss = [MissHistory(self.history_s) for _ in range(n)]
        self.fresh = min(1.0, spec.interval_s / spec.window_s) if spec.window_s > 0 else 1.0
        self.decay = 0.5 ** (spec.interval_s / self.half_life_s)
        self.weights = [max(t.weight, 1e-9) for t in spec.tenants]
        self.footprint = [0.0] * n
        self.service = [0.0] * n
        self.kv_tokens = 0.0  # K: the KV cache's size in tokens, learned from usage
        self.prefill_budget = math.inf  # P
        self.budget_hold = -math.inf
        self.prompt = [0.0] * n  # mean prompt of the requests it has queued, last seen
        self.hold_until = [-math.inf] * n
        self.timeout = spec.queue_timeout_s if math.isfinite(spec.queue_timeout_s) else math.inf
        self.ramping = [True] * n
        self.quota = None if anchors is None else [spec.limits.clamp(int(c)) for c in anchors]

    # ------------------------------------------------------------------ readings
    def _at_risk(self, i: int, t: TenantObservation, now: float) -> bool:
        slo_ttft, slo_tpot = self.spec.tenants[i].slo_ttft_s, self.spec.tenants[i].slo_tpot_s
        if t.samples > 0:
            ok = 1.0
            if math.isfinite(slo_ttft):
                ok *= 1.0 - share_above(t.ttft_p50, t.ttft_p95, t.ttft_p99, slo_ttft)
            if math.isfinite(slo_tpot) and t.tpot_p99 > 0:
                ok *= 1.0 - share_above(t.tpot_p50, tpot_p95(t), t.tpot_p99, slo_tpot)
            self.miss[i].add(now, t.completions * self.fresh, 1.0 - ok)
        return self.latency[i] and self.miss[i].bounds(self.z)[0] > self.miss_target

    def learn(self, obs: Observation) -> None:
        """Update the footprint, queued-prompt, service and KV-size estimates from one Observation (the module
        docstring's formulas); the contract controller reads them too."""
        held = 0.0
        for i, t in enumerate(obs.tenants):
            if t.in_flight > 0 and t.tokens_in_flight > 0:
                f = t.tokens_in_flight / t.in_flight
                self.footprint[i] = f if self.footprint[i] == 0 else 0.8 * self.footprint[i] + 0.2 * f
            if t.queue_depth > 0 and t.prompt_tokens_queued > 0:
                self.prompt[i] = t.prompt_tokens_queued / t.queue_depth
            held += t.tokens_in_flight
            per_req = self.footprint[i] or 1.0
            rate = weighted_tokens_per_s(t, obs.window_s, per_req)
            self.service[i] = self.decay * self.service[i] + (1 - self.decay) * rate / self.weights[i]
        # only when nothing waits in the engine is every token in flight in the KV cache
        if obs.gpu_mem_util >= 0.05 and held > 0 and obs.engine_waiting < 1:
            self.kv_tokens = max(0.99 * self.kv_tokens, held / obs.gpu_mem_util)

    # ------------------------------------------------------------------ decision
    def act(self, obs: Observation) -> list[int]:
        self.learn(obs)
        now, lim, k = obs.time_s, self.spec.limits, self.spec.limits.max_step
        tenants = obs.tenants
        n = len(tenants)
        quota = self.quota
        risk = [self._at_risk(i, t, now) for i, t in enumerate(tenants)]
        own = [t.queue_depth > 0 and math.isfinite(s := self.spec.tenants[i].slo_ttft_s)
               and t.queue_wait_p99 >= self.own_frac * s for i, t in enumerate(tenants)]
        urgent = [t.queue_depth > 0 and t.queue_wait_p99 >= self.urgent_frac * self.timeout for t in tenants]
        prefill = sum(t.prefill_tokens for t in tenants)
        held = sum(t.tokens_in_flight for t in tenants)
        saturated = (obs.engine_waiting >= self.waiting_high or obs.gpu_mem_util >= self.kv_high
                     or obs.preemptions > 0)
        victim = any(r and not o for r, o in zip(risk, own, strict=True))
        out = [0] * n
        if quota is not None:  # (0) quotas: walk to the quota first (the ramp), as static:best does
            for i, t in enumerate(tenants):
                if self.ramping[i]:
                    out[i] = max(-k, min(k, quota[i] - int(t.limit)))
                    self.ramping[i] = out[i] != 0
            if any(self.ramping):
                return out
        if not saturated:  # (1) slow because of its own limit, and the engine has room
            for i in range(n):
                if (risk[i] and own[i]) or (urgent[i] and not victim):
                    out[i] = k if quota is None else max(0, min(k, quota[i] - int(tenants[i].limit)))
        if saturated or victim:  # (2) the donor pays; with quotas, only what it borrowed
            if prefill > 0 and now >= self.budget_hold:
                base = prefill if math.isinf(self.prefill_budget) else min(self.prefill_budget, prefill)
                self.prefill_budget = max(2.0 * max(self.prompt), base * (1.0 - self.cut))
                self.budget_hold = now + self.hold_s
            floor = [lim.min] * n
            if quota is not None:  # a latency tenant keeps its quota; one without can wait below it
                floor = [q if self.latency[i] or not self.cut_below else lim.min for i, q in enumerate(quota)]
            cand = [i for i in range(n) if tenants[i].in_flight > 0 and not risk[i] and out[i] == 0
                    and tenants[i].limit > floor[i]]
            if cand:
                d = max(cand, key=lambda i: (not self.latency[i], self.service[i]))
                t = tenants[d]
                target = max(floor[d], math.floor((1.0 - self.cut) * t.in_flight))
                out[d] = -min(k, max(0, int(t.limit) - target))
                self.hold_until[d] = now + self.hold_s
            return out
        if math.isfinite(self.prefill_budget):
            self.prefill_budget *= self.p_grow
        if quota is not None:  # borrowing needs every latency tenant healthy, not merely "not at risk"
            # a tenant that misses because it waits at its own limit is not hurt by a loan to another
            healthy = all(not self.latency[i] or (self.own_excused and own[i]) or (
                self.miss[i].n >= self.min_samples
                and self.miss[i].bounds(self.z)[1] <= self.healthy_frac * self.miss_target) for i in range(n))
            for i, t in enumerate(tenants):  # (4) give back what is borrowed and unused; take back a cut
                if t.limit > quota[i] and t.queue_depth <= 0 and not out[i]:
                    out[i] = -min(k, int(t.limit) - max(quota[i], math.ceil(t.in_flight)))
                elif t.limit < quota[i] and now >= self.hold_until[i] and not out[i]:
                    out[i] = min(k, quota[i] - int(t.limit))
            if not healthy:
                return out
        kv_room = self.kv_target * self.kv_tokens - held if self.kv_tokens > 0 else math.inf
        if quota is not None and self.kv_tokens > 0:  # what is lent is bounded: it comes back only as it ends
            lent = sum(max(0, int(t.limit) - q) * (self.footprint[i] or 1.0)
                       for i, (t, q) in enumerate(zip(tenants, quota, strict=True)))
            kv_room = min(kv_room, self.borrow_frac * self.kv_tokens - lent)
        pf_room = self.prefill_budget - prefill
        for i in sorted(range(n), key=lambda j: self.service[j]):  # (3) least served first
            t = tenants[i]
            if out[i] or t.queue_depth <= 0 or now < self.hold_until[i] or t.limit > t.in_flight + k:
                continue
            if quota is not None and t.limit >= quota[i] and self.fresh_only and own[i]:
                continue  # a loan to a queue already past its TTFT objective buys no good request
            f = self.footprint[i] or 1.0
            p = self.prompt[i]
            room = min(k, math.ceil(t.queue_depth))
            if math.isfinite(kv_room):
                room = min(room, max(0, math.floor(kv_room / f)))
            if p > 0 and math.isfinite(pf_room):
                room = min(room, max(0, math.floor(pf_room / p)))
            if room > 0:
                out[i] = room
                kv_room -= room * f
                pf_room -= room * p
        return out

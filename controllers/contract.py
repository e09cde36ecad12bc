"""``contract``: keep every tenant's contract first, lend what the contracts leave idle, reclaim at once.

A hand-written controller for tenants with contracts (core/contract.py). It is told nothing tuned for the
scenario: it reads the ``ControlSpec`` (each ``TenantSpec.contract``, ``contract_load``, its objectives, the
limits) at ``reset`` and the ``Observation`` each interval. Per decision, for each tenant ``i``:

* **Owner**: a tenant with a contract and in-contract demand (``λc > 0`` or work queued or in flight), with
  ``λc_i = min(arrivals_i / window, r_i)`` its in-contract rate and ``r_i`` its contracted requests/s (a token
  contract converted at the tenant's mean request size: its mean prompt, ``PromptSize``, plus its output
  tokens per completion). **Impatient**: it has a TTFT objective under ``patient_s``; **patient** otherwise
  (its requests may wait their turn).
* **Guarantee** ``g_i`` — two estimates, ``guarantee=``:

  - ``"little"`` (the default). An impatient tenant: Little's law at its contracted rate,
    ``ceil(b_i · (headroom · m + z · √m))`` with ``m = r_i · S_i`` — the slots its contracted load keeps busy,
    with room for the spread (the requests in service of a Poisson stream are Poisson with mean m); at the
    contracted rate, not the observed one (``standby``), so an idle owner's limit already stands at its
    guarantee when its demand returns (a limit it does not use costs nothing; what is lent is the engine's
    room, rule 4). ``S_i``, how long a request holds a slot, is taken at the decode step the contracts can
    live with, not at the engine's current one: ``out_i · step_frac · T + prefill_s``, with ``out_i`` the
    tenant's output tokens per completion (EMA) and ``T`` the tightest TPOT objective among the contracted
    tenants; a hold time measured on a contended engine grows faster than its step (its requests also wait
    longer to start), so a guarantee built on it asks for more slots, which contend more. Where no contracted
    tenant has a TPOT objective, or before a completion has shown ``out_i``, ``S_i`` is measured: Little's
    law on averages, ``EMA(in_flight) / EMA(completions / window)`` (``smooth``), kept by an EMA that takes a
    lower reading at ``alpha``, a higher one at ``alpha_up`` and none above the current one while the engine
    is saturated (contention inflates a hold time, and an inflated guarantee inflates contention).
    ``b_i`` adapts to why the owner misses: over its TPOT objective (``share_above`` past ``risk_frac`` of
    its allowance ``1 − attainment``: the decode step its own requests share, so fewer of them in flight is
    faster) ×``boost_down`` down to ``boost_min``;
    waiting past ``own_frac`` × its TTFT objective in its own queue, or its queue not shrinking at its
    guarantee while it sends no more than 1.1 × its contract (then all of it is in contract) ×``boost_up``
    up to ``boost_max``; otherwise back toward 1 by ``boost_decay``.
    A patient tenant: by its good completions, at most one step a window — +1 while ``goodput`` is under
    ``(1 + patient_margin) · λc``, it uses its guarantee and the engine is neither saturated nor hurting an
    impatient owner (an impatient owner at risk last decision); −1 while ``goodput`` exceeds
    ``(1 + 2 · patient_margin) · λc``. It starts at ``limits.min``.
  - ``"share"``: the nominal as the contract baselines compute it (controllers/contracts_field.py:
    ``C = n × limits.initial``, the operator's own total, divided by the contracts' loads).

  Either way never more than ``load_headroom`` × its contract's share of the KV cache
  (``contract_load · K / f_i``, where the load and K are known), at least ``limits.min``, at most its ceiling.
  A tenant without a contract has ``g = limits.min``: all it gets is lent.
* **Borrower**: a tenant above its guarantee (its loan is ``limit − g``).
* **At risk**: an owner whose queue does not shrink at its guarantee (the test above), or whose window misses
  a p99 objective (``slo_missed``) or a per-request one (the estimated share over it past ``risk_frac`` of its
  allowance) while its own admission wait is short (under ``own_frac`` × its TTFT objective): then the
  engine, not its limit, makes it slow. **Saturated**: the ``saturation`` gate's score
  (``max(engine_waiting / 5, gpu_mem_util / 0.8)``) ≥ 1, or preemptions in the window. **Hot** / **warm**: the
  decode step (the largest ``tpot_p50`` in the window) over ``tpot_cut`` / ``tpot_lend`` × the tightest TPOT
  objective among the contracted tenants, idle ones included (they will find that step when they return).

Rules, in order (each limit moves at most ``max_step``):

1. **Guarantees first**: an owner (with ``standby``, any contracted tenant) below its guarantee walks up to it.
2. **Reclaim**: when an owner is below its guarantee with a queue (its in-contract demand returned), an owner
   is at risk or the step is hot, every borrower not itself at risk is cut toward its guarantee (by at most
   ``max_step``, never below it); when the engine is saturated and nothing else, the largest loan alone is
   cut. Owners below their guarantee are never cut. While any loan is out, or the engine is saturated,
   nothing else happens.
3. **Give back**: a borrower with an empty queue returns what it does not use, down to ``max(g, in_flight)``.
4. **Lend**: unless the step is warm, backlogged tenants grow (least loan first; while an owner is at risk,
   only it), each by at most ``max(1, lend_frac × its limit)``, while the token ledgers have room, as
   ``ledger`` measures them (controllers/ledger.py, whose estimates it reads: the per-request footprint
   ``f_i``, the KV cache's size K learned from usage, the mean prompt queued ``p_i``): Δ requests of tenant i
   fit while ``Σ tokens_in_flight + reserve + Δ·f_i ≤ kv_target · K``, ``reserve`` the footprint of the
   owners' unused guarantees (``Σ max(0, g_j − in_flight_j) · f_j``), so a loan never takes the room an
   owner's in-contract requests will need, and ``Σ prefill_tokens + Δ·p_i ≤ prefill_frac · K``.

Nothing in it is tuned to a scenario: it uses neither static:best's nor static:contract's caps. No randomness:
deterministic given the observations.
"""

from __future__ import annotations

import math

from admit.controllers.common import slo_missed, tpot_p95
from admit.controllers.contracts_field import MEAN_TOKENS, ceiling, contract_shares, nominal_caps
from admit.controllers.field import PromptSize
from admit.controllers.ledger import LedgerController
from admit.controllers.saturation import SaturationGateController
from admit.controllers.slo_bound import share_above
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec

GUARANTEES = ("little", "share")


class ContractController:
    name = "contract"

    def __init__(self, guarantee: str = "little", headroom: float = 2.0, z: float = 2.0, alpha: float = 0.5,
                 alpha_up: float = 0.3,
                 boost_up: float = 1.25, boost_max: float = 2.0, boost_decay: float = 0.95,
                 boost_down: float = 0.8, boost_min: float = 0.2,
                 own_frac: float = 0.5, kv_target: float = 0.85, prefill_frac: float = 0.25,
                 load_headroom: float = 1.5, patient_s: float = 10.0, patient_margin: float = 0.2,
                 lend_frac: float = 0.25, standby: bool = True, risk_frac: float = 0.5,
                 tpot_lend: float = 0.5, tpot_cut: float = 0.8, smooth: float = 0.2,
                 step_frac: float = 0.6, prefill_s: float = 0.5, mean_tokens: float = MEAN_TOKENS) -> None:
        if guarantee not in GUARANTEES:
            raise ValueError(f"guarantee must be one of {', '.join(GUARANTEES)}, got {guarantee!r}")
        self.guarantee, self.headroom, self.z, self.alpha, self.alpha_up = guarantee, headroom, z, alpha, alpha_up
        self.boost_up, self.boost_max, self.boost_decay = boost_up, boost_max, boost_decay
        self.boost_down, self.boost_min = boost_down, boost_min
        self.own_frac, self.kv_target, self.prefill_frac = own_frac, kv_target, prefill_frac
        self.mean_tokens, self.load_headroom = mean_tokens, load_headroom
        self.patient_s, self.patient_margin, self.lend_frac = patient_s, patient_margin, lend_frac
        self.standby, self.risk_frac = standby, risk_frac
        self.tpot_lend, self.tpot_cut, self.smooth = tpot_lend, tpot_cut, smooth
        self.step_frac, self.prefill_s = step_frac, prefill_s
        self.gate = SaturationGateController()

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        n = spec.n_tenants
        self.contracts = [t.contract for t in spec.tenants]
        self.tight_tpot = min((t.slo_tpot_s for t in spec.tenants if t.contract is not None), default=math.inf)
        self.attainment = [t.contract.attainment if t.contract is not None else 1.0 for t in spec.tenants]
        self.nominal = nominal_caps(spec, contract_shares(spec, self.mean_tokens)[0])
        self.ledger = LedgerController()  # its footprint and KV estimates (rule 4)
        self.ledger.reset(spec, seed)
        self.prompt = PromptSize(n)
        self.hold = [0.0] * n  # S_i, seconds; 0: not read yet
        self.out_tokens = [0.0] * n  # output tokens per completion, EMA
        self.busy = [0.0] * n  # requests in flight, EMA
        self.done = [0.0] * n  # completions per second, EMA
        self.boost = [1.0] * n
        self.prev_queue = [0.0] * n
        self.g = [spec.limits.min] * n
        self.patient_g = [spec.limits.min] * n
        self.patient_next = [-math.inf] * n
        self.impatient_risk = False
        # no TTFT objective (or one of at least patient_s): its requests may wait their turn
        self.patient = [not t.slo_ttft_s < self.patient_s and not t.slo_ttft_p99_s < self.patient_s
                        for t in spec.tenants]

    # ------------------------------------------------------------------ readings
    def contract_rps(self, i: int) -> float:
        """Tenant i's contract in requests per second (0 without one)."""
        c = self.contracts[i]
        if c is None:
            return 0.0
        if c.unit == "requests":
            return c.rate
        size = self.prompt.value[i] + self.out_tokens[i] if self.prompt.seen[i] else self.mean_tokens
        return c.requests_per_s_at(size)

    def _learn(self, obs: Observation, saturated: bool) -> None:
        self.ledger.learn(obs)
        self.prompt.update(obs)
        w = max(obs.window_s, 1e-9)
        b = self.smooth
        for i, t in enumerate(obs.tenants):
            # Little's law on averages: the requests it holds over the rate they finish at, each an EMA (an
            # instantaneous in-flight count over a window's completions swings with every burst)
            self.busy[i] += b * (t.in_flight - self.busy[i]) if b > 0 else t.in_flight - self.busy[i]
            self.done[i] += b * (t.completions / w - self.done[i]) if b > 0 else t.completions / w - self.done[i]
            s = 0.0
            if t.completions > 0 and t.in_flight > 0:
                s = self.busy[i] / self.done[i] if self.done[i] > 0 else 0.0
                x = t.output_tokens_per_s * w / t.completions
                self.out_tokens[i] = x if self.out_tokens[i] == 0 else self.out_tokens[i] + self.alpha * (
                    x - self.out_tokens[i])  # the first reading as it is
            elif t.samples > 0 and t.e2e_p50 > 0:
                s = t.e2e_p50
            if s > 0 and saturated:  # none at all before a reading off saturation
                s = min(s, self.hold[i])  # a saturated engine's hold times would inflate every guarantee
            if s > 0:  # a lower envelope: down at once, up slowly (contention inflates a reading, never deflates)
                a = self.alpha if s < self.hold[i] else self.alpha_up
                self.hold[i] = s if self.hold[i] == 0 else self.hold[i] + a * (s - self.hold[i])

    def hold_s(self, i: int) -> float:
        """``S_i``: seconds a request of tenant i holds a slot, at the target decode step where that is known
        (``out_i · step_frac · T + prefill_s``), else as measured (0: nothing read yet)."""
        if math.isfinite(self.tight_tpot) and self.out_tokens[i] > 0:
            return self.out_tokens[i] * self.step_frac * self.tight_tpot + self.prefill_s
        return self.hold[i]

    def throughput_guarantee(self, i: int, t: TenantObservation, lam: float, own: bool, hold_up: bool,
                             now: float) -> int:
        """A patient owner's guarantee, by its good completions, adjusted at most once a window (they are counted
        over one): +1 while they fall short of ``(1 + patient_margin) · λc``, it uses its guarantee and nothing
        holds it (``hold_up``: the engine is saturated, so the engine and not its limit is what it lacks, or an
        impatient owner missed its objective last decision); −1 while they exceed ``(1 + 2 · patient_margin) ·
        λc``."""
        lo = self.spec.limits.min
        if not own:
            if not self.standby:
                self.patient_g[i] = lo
            return self.patient_g[i]
        if now >= self.patient_next[i]:
            g = self.patient_g[i]
            if t.goodput < (1.0 + self.patient_margin) * lam and t.in_flight >= g - 0.5 and not hold_up:
                g += 1
            elif t.goodput > (1.0 + 2.0 * self.patient_margin) * lam and g > lo:
                g -= 1
            if g != self.patient_g[i]:
                self.patient_next[i] = now + self.spec.window_s
            self.patient_g[i] = max(lo, min(ceiling(self.spec, i), g))
        return self.patient_g[i]

    def adapt(self, i: int, t: TenantObservation, own: bool, grows: bool) -> float:
        """The factor ``b_i`` on an impatient owner's Little guarantee, by why it misses: over its TPOT objective
        (the decode step its own requests share; more of its own in flight makes it slower) → ×``boost_down``
        (to ``boost_min``); waiting past ``own_frac`` × its TTFT objective in its own queue, or its guarantee
        short (``grows``) → ×``boost_up`` (to ``boost_max``); neither → back toward 1 by ``boost_decay``."""
        b = self.boost[i]
        if not own:
            return b
        spec = self.spec.tenants[i]
        allow = self.risk_frac * (1.0 - self.attainment[i])
        slow = (t.samples > 0 and math.isfinite(spec.slo_tpot_s) and t.tpot_p99 > 0
                and share_above(t.tpot_p50, tpot_p95(t), t.tpot_p99, spec.slo_tpot_s) > allow)
        waits = (t.queue_depth > 0 and math.isfinite(spec.slo_ttft_s)
                 and t.queue_wait_p99 >= self.own_frac * spec.slo_ttft_s)
        if slow:
            return max(self.boost_min, b * self.boost_down)
        if grows or waits:
            return min(self.boost_max, b * self.boost_up)
        return b * self.boost_decay if b > 1.0 else min(1.0, b / self.boost_decay)

    def guarantees(self, obs: Observation, saturated: bool) -> tuple[list[int], list[bool], list[bool]]:
        """Each tenant's guarantee, whether it is an owner, and whether its queue grows at its guarantee."""
        lim, w = self.spec.limits, max(obs.window_s, 1e-9)
        g, owner, short = [], [], []
        for i, t in enumerate(obs.tenants):
            top = ceiling(self.spec, i)
            rate = self.contract_rps(i)
            seen = t.arrivals / w
            lam = min(seen, rate)
            own = rate > 0 and (lam > 0 or t.queue_depth > 0 or t.in_flight > 0)
            grows = (own and t.queue_depth > 0 and t.queue_depth >= self.prev_queue[i] and t.limit <= self.g[i]
                     and seen <= 1.1 * rate)
            self.boost[i] = self.adapt(i, t, own, grows)
            if rate <= 0:
                gi = lim.min
            elif self.guarantee == "share":
                gi = self.nominal[i] if own or self.standby else lim.min
            elif self.hold_s(i) <= 0:
                gi = lim.min  # no hold time read yet
            else:
                m = (rate if self.standby else lam) * self.hold_s(i)
                gi = math.ceil(self.boost[i] * (self.headroom * m + self.z * math.sqrt(m)))
            if self.guarantee == "little" and self.patient[i] and rate > 0:
                gi = self.throughput_guarantee(i, t, lam, own, saturated or self.impatient_risk, obs.time_s)
            load, kv = self.spec.tenants[i].contract_load, self.ledger.kv_tokens
            if load is not None and kv > 0 and rate > 0:  # never more than its contract's share of the KV cache
                gi = min(gi, math.ceil(self.load_headroom * load * kv / (self.ledger.footprint[i] or 1.0)))
            g.append(max(lim.min, min(top, gi)))
            owner.append(own)
            short.append(grows)
            self.prev_queue[i] = t.queue_depth
        return g, owner, short

    def miss_share(self, i: int, t: TenantObservation) -> float:
        """The estimated share of the window's requests of tenant i over one of its per-request objectives (TTFT,
        TPOT, end to end: what makes a request not good), from the window's percentiles (``share_above``; TPOT's
        p95 interpolated as ``ledger`` does)."""
        if t.samples <= 0:
            return 0.0
        spec = self.spec.tenants[i]
        ok = 1.0
        if math.isfinite(spec.slo_ttft_s):
            ok *= 1.0 - share_above(t.ttft_p50, t.ttft_p95, t.ttft_p99, spec.slo_ttft_s)
        if math.isfinite(spec.slo_tpot_s) and t.tpot_p99 > 0:
            ok *= 1.0 - share_above(t.tpot_p50, tpot_p95(t), t.tpot_p99, spec.slo_tpot_s)
        if math.isfinite(spec.slo_e2e_s):
            ok *= 1.0 - share_above(t.e2e_p50, t.e2e_p95, t.e2e_p99, spec.slo_e2e_s)
        return 1.0 - ok

    # ------------------------------------------------------------------ decision
    def act(self, obs: Observation) -> list[int]:
        saturated = self.gate.saturation(obs) >= 1.0 or obs.preemptions > 0
        self._learn(obs, saturated)
        k = self.spec.limits.max_step
        ts = obs.tenants
        n = len(ts)
        g, owner, short = self.guarantees(obs, saturated)
        self.g = g
        lim = [round(t.limit) for t in ts]
        risk = []
        for i, t in enumerate(ts):
            slo_ttft = self.spec.tenants[i].slo_ttft_s
            own_wait = t.queue_depth > 0 and math.isfinite(slo_ttft) and t.queue_wait_p99 >= self.own_frac * slo_ttft
            missed = slo_missed(t) or self.miss_share(i, t) > self.risk_frac * (1.0 - self.attainment[i])
            risk.append(owner[i] and (short[i] or (missed and not own_wait)))
        self.impatient_risk = any(r and not self.patient[i] for i, r in enumerate(risk))
        out = [0] * n
        for i in range(n):  # (1) guarantees first
            if (owner[i] or (self.standby and self.contracts[i] is not None)) and lim[i] < g[i]:
                out[i] = min(k, g[i] - lim[i])
        returned = any(owner[i] and lim[i] < g[i] and ts[i].queue_depth > 0 for i in range(n))
        loan = [max(0, lim[i] - g[i]) for i in range(n)]
        # the decode step every running request shares: past a share of the tightest TPOT objective a contract
        # carries, the loans are what to cut (a returning owner would find it too slow), and nothing more is lent
        step = max((t.tpot_p50 for t in ts if t.samples > 0), default=0.0)
        hot, warm = step > self.tpot_cut * self.tight_tpot, step > self.tpot_lend * self.tight_tpot
        reclaim = returned or any(risk) or hot
        if reclaim or saturated:  # (2) reclaim from borrowers, never from owners below g
            for i in sorted(range(n), key=lambda j: (-loan[j], j)):
                if loan[i] > 0 and out[i] == 0 and not risk[i]:
                    out[i] = -min(k, loan[i])
                    if not reclaim:
                        break  # saturation alone: the largest borrower pays, one per decision
            if saturated or any(loan):
                return out
        for i, t in enumerate(ts):  # (3) an unused loan goes back
            if loan[i] > 0 and t.queue_depth <= 0:
                out[i] = -min(k, max(0, lim[i] - max(g[i], math.ceil(t.in_flight))))
        if warm:
            return out
        led = self.ledger
        fp = [led.footprint[i] or 1.0 for i in range(n)]
        held = sum(t.tokens_in_flight for t in ts)
        reserve = sum(max(0.0, g[i] - ts[i].in_flight) * fp[i] for i in range(n) if owner[i])
        kv_room = self.kv_target * led.kv_tokens - held - reserve if led.kv_tokens > 0 else math.inf
        pf_room = (self.prefill_frac * led.kv_tokens - sum(t.prefill_tokens for t in ts)
                   if led.kv_tokens > 0 else math.inf)
        for i in sorted(range(n), key=lambda j: (loan[j], j)):  # (4) lend, least loan first
            t = ts[i]
            if (out[i] != 0 or t.queue_depth <= 0 or lim[i] > t.in_flight + k or lim[i] >= ceiling(self.spec, i)
                    or (any(risk) and not risk[i])):  # while an owner is at risk only it may grow
                continue
            room = min(k, math.ceil(t.queue_depth), ceiling(self.spec, i) - lim[i],
                       max(1, math.ceil(self.lend_frac * lim[i])))
            if math.isfinite(kv_room):
                room = min(room, max(0, math.floor(kv_room / fp[i])))
            p = led.prompt[i]
            if p > 0 and math.isfinite(pf_room):
                room = min(room, max(0, math.floor(pf_room / p)))
            if room > 0:
                out[i] = room
                kv_room -= room * fp[i]
                pf_room -= room * p
        return out

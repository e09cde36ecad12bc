"""The serving field's shipped admission baselines, each mapped onto admit's action space.

Every controller here emits per-tenant concurrency-limit deltas (``to_delta`` toward a target limit, at most
``max_step`` per decision); none of the source systems has a per-tenant concurrency limit, so each class's
docstring states the source rule, where it comes from (llm-d / GIE flow control, vLLM's engine admission,
the NVIDIA Dynamo router), and how it is mapped onto limits. docs/controllers.md, "Field baselines", has
the same with measured figures.

Conventions shared by the four:

* *operator cap* — ``limits.initial``, the concurrency the deployment had before the baseline was put in
  front of it (what ``static`` keeps). The llm-d rules only ever take requests away, so their targets never
  exceed it; the vLLM and Dynamo emulations size limits from the engine instead and may go up to
  ``limits.max``.
* *demand* of a tenant — ``min(in_flight + queue_depth, limits.max)``: the concurrency it would use if
  nothing held it back.
* *mean prompt size* of a tenant (``PromptSize``) — an EMA of ``prompt_tokens_queued / queue_depth`` when
  it has a queue, else of ``tokens_in_flight / in_flight`` (an over-estimate by the tokens generated so
  far), ``default_tokens`` before any reading. The vLLM and Dynamo emulations need it to turn tokens into
  requests.

The llm-d saturation score is the one ``SaturationGateController.saturation`` computes
(controllers/saturation.py, one endpoint): ``max(engine_waiting / 5, gpu_mem_util / 0.8)``; it is reused,
not re-implemented. Only ``llmd-shed`` draws random numbers (llm-d's admitter is probabilistic), from a
numpy Generator seeded by ``reset``'s seed; the others are deterministic.
"""

from __future__ import annotations

import math

import numpy as np
from admit.controllers.common import to_delta
from admit.controllers.saturation import SaturationGateController
from admit.core.observation import NO_SLO, Observation, TenantObservation
from admit.core.spec import ControlSpec


def demand(t: TenantObservation, cap: int) -> int:
    """The concurrency the tenant would use now if nothing held it back, at most ``cap``."""
    return min(cap, round(t.in_flight + t.queue_depth))


class PromptSize:
    """Per-tenant EMA of the mean prompt size in tokens (see the module docstring)."""

    def __init__(self, n: int, alpha: float = 0.3, default_tokens: float = 1000.0) -> None:
        self.alpha = alpha
        self.value = [default_tokens] * n
        self.seen = [False] * n

    def update(self, obs: Observation) -> list[float]:
        for i, t in enumerate(obs.tenants):
            if t.queue_depth >= 1 and t.prompt_tokens_queued > 0:
                x = t.prompt_tokens_queued / t.queue_depth
            elif t.in_flight >= 1 and t.tokens_in_flight > 0:
                x = t.tokens_in_flight / t.in_flight
            else:
                continue
            self.value[i] = x if not self.seen[i] else self.value[i] + self.alpha * (x - self.value[i])
            self.seen[i] = True
        return self.value


def _deltas(targets: list[int], obs: Observation, spec: ControlSpec) -> list[int]:
    lim = spec.limits
    return [to_delta(lim.clamp(tg), t.limit, lim.max_step) for tg, t in zip(targets, obs.tenants, strict=True)]


class LlmdShedController:
    """llm-d's probabilistic admitter (``llmd-shed``).

    Source rule (llm-d / GIE flow control, ``pkg/epp/flowcontrol/README.md`` in llm-d-router): the pool's
    saturation is ``sat = max(waiting / 5, kv_usage / 0.8)`` (here one endpoint, the score of
    controllers/saturation.py), and each request of a sheddable flow is rejected with probability
    ``p_shed = min(300 · sat^5, 1)``. llm-d sheds only requests with priority < 0.

    Sheddable here: the tenants whose spec ``priority`` is below the highest priority present (the top
    priority plays llm-d's "critical", non-negative band). When every tenant shares one priority nothing
    is sheddable — what a practitioner gets deploying llm-d with default (0) priorities — and the
    controller holds every limit: it behaves exactly like ``static`` at the initial limits.

    Mapping onto concurrency limits: at each decision each of a sheddable tenant's ``D`` demanded requests
    (``demand``) is shed with probability ``p_shed`` — one binomial draw ``S ~ Binomial(D, p_shed)`` from
    the controller's seeded Generator. ``S = 0`` means nothing is shed this decision and the target is the
    operator cap; otherwise the target is ``max(limits.min, min(operator cap, D − S))``, so in expectation
    ``(1 − p_shed) · D``. Tenants that are not sheddable stay at the operator cap (llm-d only removes
    requests; it never adds concurrency the deployment did not have). A shed request waits in admit's
    queue (and may time out there) rather than getting llm-d's immediate 429. Limits move at most
    ``max_step`` per decision, which llm-d's per-request rejection does not have to respect.
    """

    name = "llmd-shed"

    def __init__(self, gain: float = 300.0, power: float = 5.0) -> None:
        self.gain, self.power = gain, power
        self.gate = SaturationGateController()

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        top = max((t.priority for t in spec.tenants), default=0)
        self.sheddable = [t.priority < top for t in spec.tenants]
        self.rng = np.random.default_rng(seed)

    def p_shed(self, obs: Observation) -> float:
        return min(self.gain * self.gate.saturation(obs) ** self.power, 1.0)

    def act(self, obs: Observation) -> list[int]:
        lim = self.spec.limits
        cap = lim.initial
        p = self.p_shed(obs)
        targets = []
        for i, t in enumerate(obs.tenants):
            target = cap
            if self.sheddable[i] and p > 0.0:
                d = demand(t, lim.max)
                shed = int(self.rng.binomial(d, p)) if d > 0 else 0
                if shed > 0:
                    target = max(lim.min, min(cap, d - shed))
            targets.append(target)
        return _deltas(targets, obs, self.spec)


class LlmdSoftController:
    """llm-d's soft-reflective ceiling between priority bands (``llmd-soft``).

    Source rule (llm-d / GIE flow control, ``pkg/epp/flowcontrol/README.md`` in llm-d-router): rank the
    priority bands, rank 0 = highest priority, ``N`` bands. Band ``i``'s ceiling is
    ``ceiling_i = 1 − i · sat / (N − 1)``; a band past its ceiling dispatches only once every
    ``k = round(sat / (1 − sat))`` calls; the top band (ceiling 1) is never gated. Our reading of "past its
    ceiling": the pool's saturation exceeds the band's ceiling, ``sat > ceiling_i`` — so the lowest band
    is gated from ``sat > 0.5``, the middle of three from ``sat > 2/3``. With ``sat ≥ 1`` a gated band gets
    nothing (``k`` is infinite). ``sat`` is controllers/saturation.py's score.

    Bands are the distinct spec priorities. One band (every tenant with the same priority, as in every
    bundled scenario) means nothing is ever gated: the controller holds every limit, like ``static``.

    Mapping onto concurrency limits: a tenant in a gated band gets ``1/k`` of its ``demand`` —
    target ``max(limits.min, min(operator cap, round(D / k)))`` — since dispatching one call in ``k``
    lets through ``1/k`` of what it would send; ``k ≤ 1`` is no gate. Tenants in ungated bands are at the
    operator cap (llm-d never raises a limit). Deterministic.
    """

    name = "llmd-soft"

    def __init__(self) -> None:
        self.gate = SaturationGateController()

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        bands = sorted({t.priority for t in spec.tenants}, reverse=True)
        self.n_bands = len(bands)
        self.rank = [bands.index(t.priority) for t in spec.tenants]

    def dispatch_fraction(self, rank: int, sat: float) -> float:
        """The share of its calls band ``rank`` dispatches at saturation ``sat`` (1 = ungated)."""
        if rank == 0 or self.n_bands < 2:
            return 1.0
        ceiling = 1.0 - rank * sat / (self.n_bands - 1)
        if sat <= ceiling:
            return 1.0
        if sat >= 1.0:
            return 0.0
        k = round(sat / (1.0 - sat))
        return 1.0 if k <= 1 else 1.0 / k

    def act(self, obs: Observation) -> list[int]:
        lim = self.spec.limits
        sat = self.gate.saturation(obs)
        targets = []
        for i, t in enumerate(obs.tenants):
            f = self.dispatch_fraction(self.rank[i], sat)
            targets.append(lim.initial if f >= 1.0 else max(lim.min, min(lim.initial, round(f * demand(t, lim.max)))))
        return _deltas(targets, obs, self.spec)


class VllmTokenCapController:
    """vLLM's ``--max-num-queued-tokens`` (``vllm-tokencap``).

    Source rule (vLLM 0.33 engine admission): a global cap on the prompt tokens in prefill; a request that
    would take the engine past it is refused (503). The suggested setting is ≈ target TTFT × prefill
    throughput. There is no per-tenant fairness.

    Cap: ``C = min over tenants with a per-request TTFT objective of slo_ttft × thr`` (``default_ttft_s``
    × thr when no tenant has one), ``thr`` the prefill throughput estimated online; until the first estimate
    the limits are held where they are (the operator's).

    Throughput estimate (tokens that left the prefill state per second, an EMA): between consecutive
    decisions ``dt`` apart, tenant i admitted about ``a_i = max(0, Δin_flight_i + completions_i · dt /
    window)`` requests (the window's completions scaled to the interval), i.e. ``a_i · m_i`` prompt tokens
    (``m_i`` its mean prompt size), so ``F = Σ_i max(0, prefill_i(prev) + a_i · m_i − prefill_i(now))``
    tokens left prefill. ``F / dt`` is a sample of the engine's prefill *capacity* only when the engine
    was prefilling throughout (``prefill_tokens_waiting > 0`` at both decisions); only those samples
    update the EMA (``alpha``), so a lightly loaded engine's low served rate does not ratchet the cap down.

    Mapping onto concurrency limits, with ``P = prefill_tokens_waiting``, the same scaling for every
    tenant (vLLM has no fairness):

    * over the cap (``P > C``): vLLM admits nothing new; every tenant gives back the same fraction
      ``1 − C/P`` of its requests in prefill (``prefill_tokens_i / m_i``): target
      ``in_flight_i − ceil((1 − C/P) · prefill_tokens_i / m_i)``, at least ``limits.min``;
    * under it (room ``R = C − P``): the same fraction ``f = min(1, R / Σ prompt_tokens_queued)`` of every
      tenant's queue may be admitted, plus, from the room left, headroom for twice the next interval's
      expected arrivals (``arrivals / window · interval``, scaled by the same factor when the room is
      short) and one request, so that an idle tenant's next request is not held for a whole interval:
      target ``in_flight_i + ceil(f · queue_depth_i) + ceil(2 · g · expected_i) + 1``.

    This approximates a per-request token check with limits that move every interval and at most
    ``max_step`` at a time; a prompt bigger than the cap still gets in when there is room for one request
    (the ``+ 1``). Deterministic.
    """

    name = "vllm-tokencap"

    def __init__(self, default_ttft_s: float = 1.0, alpha: float = 0.2, arrival_headroom: float = 2.0) -> None:
        self.default_ttft_s, self.alpha, self.arrival_headroom = default_ttft_s, alpha, arrival_headroom

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        self.prompt = PromptSize(spec.n_tenants)
        ttfts = [t.slo_ttft_s for t in spec.tenants if math.isfinite(t.slo_ttft_s)]
        self.target_ttft = min(ttfts, default=self.default_ttft_s)
        self.thr: float | None = None  # prefill tokens per second
        self.prev: Observation | None = None

    def _estimate(self, obs: Observation, m: list[float]) -> None:
        prev, self.prev = self.prev, obs
        if prev is None:
            return
        dt = obs.time_s - prev.time_s
        if dt <= 0 or prev.prefill_tokens_waiting <= 0 or obs.prefill_tokens_waiting <= 0:
            return
        scale = dt / obs.window_s if obs.window_s > 0 else 1.0
        left = 0.0
        for t0, t1, mi in zip(prev.tenants, obs.tenants, m, strict=True):
            admitted = max(0.0, t1.in_flight - t0.in_flight + t1.completions * scale)
            left += max(0.0, t0.prefill_tokens + admitted * mi - t1.prefill_tokens)
        sample = left / dt
        self.thr = sample if self.thr is None else self.thr + self.alpha * (sample - self.thr)

    def cap(self) -> float:
        """The prefill-token cap now (inf until the throughput is known)."""
        return math.inf if self.thr is None else self.target_ttft * self.thr

    def act(self, obs: Observation) -> list[int]:
        m = self.prompt.update(obs)
        self._estimate(obs, m)
        lim, c, p = self.spec.limits, self.cap(), obs.prefill_tokens_waiting
        ts = obs.tenants
        if not math.isfinite(c):
            return [0] * obs.n_tenants  # no estimate yet: hold the operator's limits
        if p > c:
            cut = 1.0 - c / p
            targets = [max(lim.min, int(t.in_flight) - math.ceil(cut * t.prefill_tokens / max(mi, 1.0)))
                       for t, mi in zip(ts, m, strict=True)]
            return _deltas(targets, obs, self.spec)
        room = c - p
        queued = sum(t.prompt_tokens_queued for t in ts)
        f = 1.0 if queued <= room else room / queued
        left = max(0.0, room - queued)
        per = self.spec.interval_s / obs.window_s if obs.window_s > 0 else 1.0
        expected = [t.arrivals * per for t in ts]
        want = sum(e * mi for e, mi in zip(expected, m, strict=True))
        g = 1.0 if want <= left else left / want
        targets = [int(t.in_flight) + math.ceil(f * t.queue_depth) + math.ceil(self.arrival_headroom * g * e) + 1
                   for t, e in zip(ts, expected, strict=True)]
        return _deltas(targets, obs, self.spec)


class DynamoWdrrController:
    """NVIDIA Dynamo router's policy-class queues (``dynamo-wdrr``), emulated on concurrency limits.

    Source rule (NVIDIA Dynamo router, PR #10744): requests wait in per-class queues (with
    ``request_queue_limit``, ``uncached_token_queue_limit`` and ``slo_ttft_ms`` per class); the router
    dispatches from them by weighted deficit round robin between classes and, within a class, earliest
    deadline first on the TTFT due time (arrival + slo_ttft).

    admit's admission core has no dispatch-order hook — it admits from each tenant's FIFO queue whenever
    that tenant is under its limit — so this is an approximation on the concurrency action space:

    * classes are tenants, class weights the spec ``weight``;
    * a shared concurrency budget ``B`` (requests) stands for "the engine can take more": it starts at
      ``Σ limits.initial``; when the engine is congested (``engine_waiting ≥ waiting_high`` (1, i.e.
      keep the engine's own queue ≈ 0) or KV usage ≥ ``kv_high`` (0.9)) it drops to
      ``decrease · min(B, Σ in_flight)``; otherwise, when the tenants' total demand exceeds it, it grows by
      ``max_step``; it stays in ``[n · limits.min, n · limits.max]``;
    * every decision re-partitions the whole budget by one DRR pass over ``B`` slots: each round, tenants
      with unmet demand are visited most urgent first (least TTFT slack ``slo_ttft − queue_wait_p99``;
      tenants without a TTFT objective by their e2e objective, then none), each adds a quantum
      ``max cost · w_i / max w`` (both over the tenants still in the pass) to its deficit and takes slots
      while its deficit covers its cost (its mean prompt size in tokens, ``PromptSize``) and its demand
      is unmet. Deficits start at zero at
      each decision, since each decision re-hands out the whole budget rather than the next requests;
    * budget left once every demand is met is headroom for arrivals, split in proportion to weight (the
      remainder one slot at a time, most urgent first); the target is the tenant's slots plus headroom.

    Within a tenant every request carries the same ``slo_ttft``, so EDF on the due time is FIFO on arrival:
    admit's per-tenant FIFO queue already orders a class the way Dynamo does. What the emulation loses:
    Dynamo picks the next request at each dispatch and shares free capacity on demand; here the partition
    is fixed for an interval, so a burst of one tenant cannot take another's idle headroom until the next
    decision, and limits move at most ``max_step`` per decision. Deterministic.
    """

    name = "dynamo-wdrr"

    def __init__(self, waiting_high: float = 1.0, kv_high: float = 0.9, decrease: float = 0.9) -> None:
        self.waiting_high, self.kv_high, self.decrease = waiting_high, kv_high, decrease

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        n, lim = spec.n_tenants, spec.limits
        self.weights = [max(t.weight, 1e-9) for t in spec.tenants]
        self.b_min, self.b_max = n * lim.min, n * lim.max
        self.budget = float(n * lim.initial)
        self.prompt = PromptSize(n)

    def update_budget(self, obs: Observation) -> float:
        in_flight = sum(t.in_flight for t in obs.tenants)
        want = sum(demand(t, self.spec.limits.max) for t in obs.tenants)
        if obs.engine_waiting >= self.waiting_high or obs.gpu_mem_util >= self.kv_high:
            self.budget = self.decrease * min(self.budget, in_flight)
        elif want > self.budget:
            self.budget += self.spec.limits.max_step
        self.budget = min(float(self.b_max), max(float(self.b_min), self.budget))
        return self.budget

    @staticmethod
    def slack(t: TenantObservation) -> float:
        for slo in (t.slo_ttft, t.slo_e2e):
            if slo < NO_SLO:
                return slo - t.queue_wait_p99
        return math.inf

    def allocate(self, budget: int, demands: list[int], costs: list[float], order: list[int]) -> list[int]:
        """One DRR pass handing out ``budget`` slots: slots per tenant (demand-capped), headroom included."""
        n = len(demands)
        slots, deficit = [0] * n, [0.0] * n
        active = [i for i in order if demands[i] > 0]
        left = budget
        while left > 0 and active:
            # the heaviest active class's quantum covers any cost, so every round hands out a slot
            quantum, w_max = max(costs[i] for i in active), max(self.weights[i] for i in active)
            for i in list(active):
                deficit[i] += quantum * self.weights[i] / w_max
                while left > 0 and slots[i] < demands[i] and deficit[i] >= costs[i]:
                    slots[i] += 1
                    deficit[i] -= costs[i]
                    left -= 1
                if slots[i] >= demands[i]:
                    active.remove(i)
                if left <= 0:
                    break
        if left > 0:  # every demand met: the rest is headroom, by weight
            total_w = sum(self.weights)
            extra = [int(left * w / total_w) for w in self.weights]
            rest = left - sum(extra)
            for i in order:
                if rest <= 0:
                    break
                extra[i] += 1
                rest -= 1
            slots = [s + e for s, e in zip(slots, extra, strict=True)]
        return slots

    def act(self, obs: Observation) -> list[int]:
        lim = self.spec.limits
        costs = [max(1.0, c) for c in self.prompt.update(obs)]
        budget = int(self.update_budget(obs))
        demands = [demand(t, lim.max) for t in obs.tenants]
        order = sorted(range(obs.n_tenants), key=lambda i: (self.slack(obs.tenants[i]), i))
        return _deltas(self.allocate(budget, demands, costs, order), obs, self.spec)

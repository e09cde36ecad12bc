"""Baselines that honour tenant contracts the way trusted multi-tenant systems do, on admit's action space.

Each reads the tenants' contracts from the ``ControlSpec`` it gets at ``reset`` and emits per-tenant
concurrency-limit deltas toward a target (``to_delta``: at most ``max_step`` per decision; targets within
``[limits.min, min(limits.max, max_limit)]``). Sources (../shared/reference/contracts.md has the facts with
their sources; docs/controllers.md, "Contract baselines", the same rules with their parameters):

* ``static:share`` — static caps in proportion to the contracts, the Kueue ``nominalQuota`` habit;
* ``apf`` — Kubernetes API Priority and Fairness: nominal concurrency from shares, lendable and borrowing
  percents, the limits re-divided every 10 s from each level's seat-demand high watermark and smoothed demand
  (KEP-1040; apiserver ``apf_controller.go`` ``updateBorrowingLocked``, ``conc_alloc.go``);
* ``kueue-borrow`` — Kueue cohort borrowing: nominal quota guaranteed, unused nominal quota lent up to a
  borrowing limit, reclaimed from borrowers (never owners) when an owner's demand returns;
* ``litellm-reserved`` — LiteLLM ``dynamic_rate_limiter_v3``: below a saturation threshold any tenant may use
  idle capacity, past it each tenant is held to its reserved share;
* ``vtc`` — the Virtual Token Counter (Sheng et al., OSDI 2024): the backlogged tenant with the least weighted
  token service gets the next capacity; under saturation the most served gives it up.

Conventions shared by the five (the functions live in core/contract.py, since the simulator's and the gateway's
borrowed and lent figures divide the concurrency by them too):

* **Share** of a tenant (``contract_shares``) — its contract's share of the engine's estimated capacity,
  ``TenantSpec.contract_load`` (envs/family.py's ``contract_loads``; the contracts sum to at most 1). Tenants
  without a contract share what the contracts leave, ``1 − Σ loads``, equally. When every tenant has a
  contract and the loads sum to less than 1, they are normalised to sum to 1: a load is a share of the
  *engine's* capacity while ``C`` below is the *operator's* concurrency, so ``C`` is divided in proportion to
  the contracts rather than leaving the unreserved part idle (on h200-live-small with contracts of load 0.04
  and 0.15, ``round(C · load)`` would cap both tenants at 1). Live, where the spec has no
  loads (the gateway does not know its engine's capacity), the shares are proportional to the contracted
  requests per second instead (a token contract converted at ``mean_tokens`` tokens per request), they sum
  to 1 over the contracted tenants, and a tenant without a contract has share 0 (so ``limits.min``). With no
  contract at all every tenant has the share 1/n.
* **Total concurrency** ``C`` being divided (``total_concurrency``) — ``n × limits.initial``, the sum of the
  scenario's initial caps: the concurrency the operator already runs (what ``static`` keeps, the field
  baselines' "operator cap"), so a baseline re-divides the deployment's own total rather than one we invent.
  ``limits.max`` is a bound on one tenant, not a total, so it is not it.
* **Nominal** of a tenant (``nominal_caps``) — ``max(limits.min, round(C · share))`` (half up), at most its
  ceiling. Without contracts every nominal is ``limits.initial``: ``static:share`` is then ``static``.
* **Demand** of a tenant — ``in_flight + queue_depth``, APF's seat demand (seats executing plus seats queued).
* **Saturation** (``litellm-reserved``, ``vtc``) — the score the ``saturation`` gate computes
  (controllers/saturation.py, GIE's detector): ``max(engine_waiting / 5, gpu_mem_util / 0.8)``, saturated at
  ``threshold`` (1.0). Reused, not re-implemented.

No randomness: every rule is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from admit.controllers.common import to_delta, weighted_tokens_per_s
from admit.controllers.field import PromptSize
from admit.controllers.saturation import SaturationGateController
from admit.controllers.static import StaticController
from admit.core.contract import (
    MEAN_TOKENS,
    ceiling,
    contract_shares,
    nominal_caps,
    total_concurrency,
)
from admit.core.contract import round_half_up as _round
from admit.core.observation import Observation
from admit.core.spec import ControlSpec


def _deltas(targets: Sequence[int], obs: Observation, spec: ControlSpec) -> list[int]:
    lo, k = spec.limits.min, spec.limits.max_step
    return [to_delta(max(lo, min(ceiling(spec, i), tg)), t.limit, k)
            for i, (tg, t) in enumerate(zip(targets, obs.tenants, strict=True))]


def _demand(obs: Observation) -> list[float]:
    return [t.in_flight + t.queue_depth for t in obs.tenants]


class ShareStaticController(StaticController):
    """``static:share``: static caps in proportion to the contracts, the Kueue ``nominalQuota`` habit.

    Each tenant's cap is its nominal, ``max(limits.min, round(C · share))`` with ``C = n × limits.initial``
    (module docstring): a contracted tenant gets its contract's share of the deployment's total concurrency,
    the tenants without a contract share what the contracts leave, equally (live, with no loads known, they get
    ``limits.min``). The caps are fixed for the episode; the limits walk to them at ``max_step`` per decision,
    as ``static:N`` does (it is ``static`` with those caps, so the compiled world runs it too).
    """

    name = "static:share"

    def __init__(self, mean_tokens: float = MEAN_TOKENS) -> None:
        super().__init__(None)
        self.mean_tokens = mean_tokens

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.shares, self.basis = contract_shares(spec, self.mean_tokens)
        self.cap = nominal_caps(spec, self.shares)
        super().reset(spec, seed)


def allocate(required: float, lower: Sequence[float], upper: Sequence[float], target: Sequence[float],
             min_target: float = 0.001) -> list[float]:
    """APF's concurrency allocation problem: allocations that sum to ``required``, each
    ``clamp(p · target_i, lower_i, upper_i)`` for one fair proportion ``p`` (found by bisection); all lower
    bounds when they already reach ``required``, all upper bounds when those do not. Targets under
    ``min_target`` count as it (so a level with no demand still has a proportion)."""
    lo, hi = sum(lower), sum(upper)
    if lo >= required:
        return list(lower)
    if hi <= required:
        return list(upper)
    tg = [max(min_target, x) for x in target]

    def total(p: float) -> float:
        return sum(min(u, max(low, p * x)) for low, u, x in zip(lower, upper, tg, strict=True))

    a, b = 0.0, max(u / x for u, x in zip(upper, tg, strict=True))
    for _ in range(100):
        mid = 0.5 * (a + b)
        if total(mid) < required:
            a = mid
        else:
            b = mid
    return [min(u, max(low, b * x)) for low, u, x in zip(lower, upper, tg, strict=True)]


class ApfController:
    """``apf``: Kubernetes API Priority and Fairness borrowing, one priority level per tenant.

    Source (KEP-1040; k8s.io/apiserver ``pkg/util/flowcontrol/apf_controller.go``; flowcontrol/v1
    ``LimitedPriorityLevelConfiguration``): with ``ServerCL`` the server's concurrency and ``NCS_i`` a level's
    ``nominalConcurrencyShares``,

        NominalCL_i   = ceil(ServerCL · NCS_i / Σ NCS)
        LendableCL_i  = round(NominalCL_i · lendablePercent / 100)       minCL_i = NominalCL_i − LendableCL_i
        BorrowingCL_i = round(NominalCL_i · borrowingLimitPercent / 100)  maxCL_i = NominalCL_i + BorrowingCL_i
                        (borrowingLimitPercent nil: BorrowingCL_i = ServerCL)
        currentCL_i starts at NominalCL_i − ⌊LendableCL_i / 2⌋

    Every ``period_s`` (APF's ``borrowingAdjustmentPeriod``, 10 s) each level's seat demand over the period gives
    its high watermark, mean and standard deviation; ``smoothed_i ← max(env, a·smoothed_i + (1 − a)·env)`` with
    ``env = mean + std`` and ``a = 0.977`` (``seatDemandSmoothingCoefficient``); then, as
    ``updateBorrowingLocked`` does, ``lower_i = max(minCL_i, min(NominalCL_i, watermark_i))``,
    ``upper_i = maxCL_i``, ``target_i = max(lower_i, smoothed_i)``, and ``Σ NominalCL`` is re-divided by
    ``allocate`` (one fair proportion of the targets, within the bounds: ``conc_alloc.go``'s
    ``computeConcurrencyAllocation``); ``currentCL_i = round(alloc_i)``.
    A level with no demand keeps only ``minCL`` (its lendable seats go to the others); when its demand returns
    its watermark lifts its lower bound back to its nominal at the next adjustment.

    Mapping: ``ServerCL = C`` (``n × limits.initial``), ``NCS_i`` = the tenant's share; seat demand =
    ``in_flight + queue_depth`` sampled at each decision (APF integrates it continuously; decisions are evenly
    spaced, so the sample mean is the time average); the limit walks to ``currentCL`` at ``max_step`` per
    decision, within ``[limits.min, ceiling]``. Defaults: ``lendable_percent = 50`` — the API's own default is 0
    (nothing lent, which makes APF a fixed partition); 50 is what Kubernetes' suggested configuration gives its
    ordinary levels (``global-default``, ``workload-high``); ``borrowing_limit_percent = None`` (nil, the API's
    default: unbounded, here up to the tenant's ceiling).
    """

    name = "apf"

    def __init__(self, lendable_percent: float = 50.0, borrowing_limit_percent: float | None = None,
                 period_s: float = 10.0, smoothing: float = 0.977, mean_tokens: float = MEAN_TOKENS) -> None:
        if not 0.0 <= lendable_percent <= 100.0:
            raise ValueError(f"lendable_percent must be in [0, 100], got {lendable_percent}")
        self.lendable_percent, self.borrowing_limit_percent = lendable_percent, borrowing_limit_percent
        self.period_s, self.smoothing, self.mean_tokens = period_s, smoothing, mean_tokens

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        self.shares, self.basis = contract_shares(spec, self.mean_tokens)
        server_cl = total_concurrency(spec)
        share_sum = sum(self.shares)
        # ceil of a product that is an integer up to float error must not round it up
        self.nominal = [math.ceil(server_cl * s / share_sum - 1e-9) for s in self.shares]
        lendable = [_round(nc * self.lendable_percent / 100.0) for nc in self.nominal]
        if self.borrowing_limit_percent is None:
            borrowing = [server_cl] * spec.n_tenants
        else:
            borrowing = [_round(nc * self.borrowing_limit_percent / 100.0) for nc in self.nominal]
        self.min_cl = [nc - le for nc, le in zip(self.nominal, lendable, strict=True)]
        self.max_cl = [nc + b for nc, b in zip(self.nominal, borrowing, strict=True)]
        self.current = [nc - le // 2 for nc, le in zip(self.nominal, lendable, strict=True)]
        self.smoothed = [0.0] * spec.n_tenants
        self.samples: list[list[float]] = [[] for _ in range(spec.n_tenants)]
        self.next_adjust: float | None = None

    def update_borrowing(self) -> None:
        """One adjustment: the period's seat-demand statistics, then the seats re-divided (``currentCL``)."""
        lower, target = [], []
        for i, xs in enumerate(self.samples):
            watermark = max(xs, default=0.0)
            if xs:
                mean = sum(xs) / len(xs)
                std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
                env = mean + std
                self.smoothed[i] = max(env, self.smoothing * self.smoothed[i] + (1.0 - self.smoothing) * env)
            lo = max(float(self.min_cl[i]), min(float(self.nominal[i]), watermark))
            lower.append(lo)
            target.append(max(lo, self.smoothed[i]))
        allocs = allocate(float(sum(self.nominal)), lower, [float(m) for m in self.max_cl], target)
        self.current = [_round(a) for a in allocs]
        self.samples = [[] for _ in self.samples]

    def act(self, obs: Observation) -> list[int]:
        if self.next_adjust is None:
            self.next_adjust = (math.floor(obs.time_s / self.period_s) + 1) * self.period_s  # on the 10 s grid
        for xs, d in zip(self.samples, _demand(obs), strict=True):
            xs.append(d)
        if obs.time_s >= self.next_adjust:
            self.update_borrowing()
            while self.next_adjust <= obs.time_s:
                self.next_adjust += self.period_s
        return _deltas(self.current, obs, self.spec)


class KueueBorrowController:
    """``kueue-borrow``: Kueue cohort borrowing with reclaim, one ClusterQueue per tenant in one cohort.

    Source (Kueue ClusterQueue ``nominalQuota``, ``borrowingLimit``, ``preemption.reclaimWithinCohort``): a
    queue's nominal quota is guaranteed; the cohort's unused nominal quota may be borrowed, up to a queue's
    ``borrowingLimit``; a queue whose demand returns reclaims its nominal quota from the borrowers.

    Mapping: nominal quota = the tenant's nominal (``nominal_caps``, as ``static:share``); a tenant's limit is
    never below it (its quota is there whenever its demand comes). Per decision, with ``D_j = in_flight_j +
    queue_depth_j``, the cohort's idle quota is ``I = Σ_j max(0, nominal_j − D_j)`` and the loans
    ``B = Σ_i max(0, limit_i − nominal_i)``:

    1. a tenant below its nominal walks up to it;
    2. a borrower with an empty queue gives back what it does not use (down to ``max(nominal, in_flight)``);
    3. **reclaim**: while the loans exceed the idle quota (an owner's demand returned), borrowers are cut toward
       their nominal — never below it, and owners never — the largest loan first, at most ``max_step`` each
       per decision; Kueue preempts the borrowing workloads, here a cut limit takes effect as the borrower's
       requests finish;
    4. otherwise the idle quota left, ``I − B``, is lent to the tenants with a queue that are at or above
       their nominal, the smallest loan first (ties: tenant order), each at most ``max_step``, its queue and
       ``borrowing_limit`` (× its nominal; None: unbounded, Kueue's default, up to its ceiling).
    """

    name = "kueue-borrow"

    def __init__(self, borrowing_limit: float | None = None, mean_tokens: float = MEAN_TOKENS) -> None:
        self.borrowing_limit, self.mean_tokens = borrowing_limit, mean_tokens

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        self.shares, self.basis = contract_shares(spec, self.mean_tokens)
        self.nominal = nominal_caps(spec, self.shares)
        self.top = [ceiling(spec, i) if self.borrowing_limit is None
                    else min(ceiling(spec, i), nq + math.floor(self.borrowing_limit * nq))
                    for i, nq in enumerate(self.nominal)]

    def act(self, obs: Observation) -> list[int]:
        k, nominal = self.spec.limits.max_step, self.nominal
        ts = obs.tenants
        n = len(ts)
        lim = [round(t.limit) for t in ts]
        idle = sum(max(0.0, nq - d) for nq, d in zip(nominal, _demand(obs), strict=True))
        out = [0] * n
        for i, t in enumerate(ts):
            if lim[i] < nominal[i]:  # (1) its own quota
                out[i] = min(k, nominal[i] - lim[i])
            elif lim[i] > nominal[i] and t.queue_depth <= 0:  # (2) an unused loan goes back
                out[i] = -min(k, max(0, lim[i] - max(nominal[i], math.ceil(t.in_flight))))

        def loan(i: int) -> int:
            return max(0, lim[i] + out[i] - nominal[i])

        excess = sum(loan(i) for i in range(n)) - idle
        if excess > 0:  # (3) reclaim: cut borrowers, largest loan first, never below nominal
            for i in sorted(range(n), key=lambda j: (-loan(j), j)):
                if excess <= 0 or loan(i) <= 0:
                    break
                cut = min(k + out[i], loan(i), math.ceil(excess))
                out[i] -= cut
                excess -= cut
            return out
        free = -excess  # (4) lend the idle quota left
        for i in sorted(range(n), key=lambda j: (loan(j), j)):
            t = ts[i]
            if free < 1 or t.queue_depth <= 0 or lim[i] < nominal[i] or out[i] != 0:
                continue
            g = min(k, math.ceil(t.queue_depth), math.floor(free), self.top[i] - lim[i])
            if g > 0:
                out[i] = g
                free -= g
        return out


class LitellmReservedController:
    """``litellm-reserved``: LiteLLM's reserved shares past saturation (``dynamic_rate_limiter_v3``).

    Source (LiteLLM docs, proxy/dynamic_rate_limit; ``litellm/proxy/hooks/dynamic_rate_limiter_v3.py``): a
    model's capacity is shared across keys; while its recorded usage is below a saturation threshold any key may
    use idle capacity; once usage crosses it, each priority level is held to its reserved share.

    Mapping: the reserved share of a tenant is its nominal (``nominal_caps``, as ``static:share``). LiteLLM's
    usage is the model's requests or tokens per minute against its configured limit; a serving engine's
    equivalent is how full it is, so saturation is the ``saturation`` gate's score
    ``max(engine_waiting / 5, gpu_mem_util / 0.8)`` (KV-cache usage and the engine's own queue, GIE's detector),
    saturated at ``threshold``. Below it a tenant with a queue grows by ``max_step`` (up to its ceiling) and the
    others hold; past it every limit walks to its reserved share, at most ``max_step`` per decision.
    """

    name = "litellm-reserved"

    def __init__(self, threshold: float = 1.0, mean_tokens: float = MEAN_TOKENS) -> None:
        self.threshold, self.mean_tokens = threshold, mean_tokens
        self.gate = SaturationGateController()

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        self.shares, self.basis = contract_shares(spec, self.mean_tokens)
        self.reserved = nominal_caps(spec, self.shares)

    def saturated(self, obs: Observation) -> bool:
        return self.gate.saturation(obs) >= self.threshold

    def act(self, obs: Observation) -> list[int]:
        if self.saturated(obs):
            return _deltas(self.reserved, obs, self.spec)
        k = self.spec.limits.max_step
        return [min(k, max(0, ceiling(self.spec, i) - round(t.limit))) if t.queue_depth > 0 else 0
                for i, t in enumerate(obs.tenants)]


class VtcController:
    """``vtc``: the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024).

    Source rule: each client has a counter of the service it received, in weighted tokens (input 1, output 2),
    divided by its weight; the server serves the backlogged client with the least counter; a client that
    becomes backlogged has its counter lifted to the least counter among the clients waiting, so idle time is
    not banked as credit. Work-conserving; the service gap between backlogged clients is bounded.

    Mapping: counters advance each decision by the window's service rate times the time since the last
    decision, over the spec ``weight`` — the rate from ``weighted_tokens_per_s`` (controllers/common.py, the
    cost ``ledger`` uses too), completions counted at the tenant's mean prompt size (``PromptSize`` of
    controllers/field.py). Backlogged = a non-empty admission queue. Each decision the backlogged tenant with
    the least counter grows by ``max_step`` (its queue and ceiling permitting); when the engine is saturated
    (the ``saturation`` gate's score ≥ ``threshold``, as ``litellm-reserved``) the tenant with the most counter
    among those with work in flight is also cut by ``max_step`` (not below ``limits.min``): capacity moves from
    the most served to the least, the engine's total held. Contracts play no part: VTC is the field's
    tenant-fair reference with no notion of a promise.
    """

    name = "vtc"

    def __init__(self, threshold: float = 1.0) -> None:
        self.threshold = threshold
        self.gate = SaturationGateController()

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.spec = spec
        n = spec.n_tenants
        self.weights = [max(t.weight, 1e-9) for t in spec.tenants]
        self.counter = [0.0] * n
        self.backlogged = [False] * n
        self.prompt = PromptSize(n)
        self.prev_time: float | None = None

    def update_counters(self, obs: Observation) -> None:
        m = self.prompt.update(obs)
        dt = self.spec.interval_s if self.prev_time is None else max(0.0, obs.time_s - self.prev_time)
        self.prev_time = obs.time_s
        for i, t in enumerate(obs.tenants):
            self.counter[i] += weighted_tokens_per_s(t, obs.window_s, m[i]) * dt / self.weights[i]
        now = [t.queue_depth > 0 for t in obs.tenants]
        for i, b in enumerate(now):
            if b and not self.backlogged[i]:  # the counter lift
                waiting = [self.counter[j] for j, bj in enumerate(now) if bj and self.backlogged[j] and j != i]
                if waiting:
                    self.counter[i] = max(self.counter[i], min(waiting))
        self.backlogged = now

    def act(self, obs: Observation) -> list[int]:
        self.update_counters(obs)
        lim, k = self.spec.limits, self.spec.limits.max_step
        ts = obs.tenants
        out = [0] * len(ts)
        cut = None
        if self.gate.saturation(obs) >= self.threshold:
            donors = [i for i, t in enumerate(ts) if t.in_flight > 0 and round(t.limit) > lim.min]
            if donors:
                cut = max(donors, key=lambda i: (self.counter[i], -i))
                out[cut] = -min(k, round(ts[cut].limit) - lim.min)
        grow = [i for i, t in enumerate(ts)
                if self.backlogged[i] and i != cut and round(t.limit) < ceiling(self.spec, i)]
        if grow:
            g = min(grow, key=lambda i: (self.counter[i], i))
            out[g] = min(k, math.ceil(ts[g].queue_depth), ceiling(self.spec, g) - round(ts[g].limit))
        return out

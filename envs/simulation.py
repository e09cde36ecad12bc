"""The simulated world: workload → admission core → engine, with telemetry, in simulated time.

``Simulation`` is the one world behind the Gymnasium env, the offline evaluator and sim2live. It is
event-driven: the next event is the earliest of the next arrival, the engine's next internal event and the
admission queue's next timeout; at equal times engine events come first (a finishing request frees its
slot before a simultaneous arrival or timeout is handled).

Decisions happen between ``advance`` calls: ``observe()`` builds the Observation, ``apply_deltas()``
changes the limits (``Limits.apply``: current + delta, clamped to the scenario's bounds), ``advance(t)``
runs the world to time t and ``advance_interval()`` one decision interval on. ``step(deltas)`` is one
decision (apply, then one interval on): the env's ``step`` is ``Simulation.step``. ``run(controller)`` is
core/loop.py's one decision loop (observe → act → validate → apply → one interval on) driving
``SimulatedWorld``, the world seen as that loop's ``World``; the evaluator and sim2live call it.

The requests are the scenario's draws for the seed (``draw_requests``) unless the caller hands the
simulation its own (``Simulation(scenario, seed, requests=...)``, as sim2live does with the replayed ones).
Where a tenant has a contract, each of its requests is classified in or out of contract before the run, on
the arrivals alone (``in_contract``: core/contract.py's envelope, as the gateway classifies at arrival), and
the admission core queues its in-contract requests before its excess.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np
from admit.core.admission import AdmissionCore, Offer, QueueConfig
from admit.core.contract import Contract
from admit.core.controller import Controller
from admit.core.loop import OnDecision, RunStats, run_loop
from admit.core.observation import Observation
from admit.core.percentiles import linear_np_many
from admit.core.telemetry import (
    PreemptionWindow,
    TenantTokens,
    TenantWindows,
    build_observation,
    observation_values,
)
from admit.engine.base import Engine
from admit.engine.request import Request
from admit.engine.slot_engine import SlotEngine
from admit.envs.scenario import Scenario, SlotEngineConfig
from admit.envs.workload import draw_tenant

if TYPE_CHECKING:
    from admit.envs.compiled import CompiledSimulation


def make_engine(scenario: Scenario) -> Engine:
    cfg = scenario.engine
    if isinstance(cfg, SlotEngineConfig):
        return SlotEngine(cfg.slots, cfg.mean_service_s, cfg.distribution)
    from admit.engine.token_engine import make_token_engine  # the token engine is optional at import time

    return make_token_engine(cfg)


# a new array("d") with no Python frame per call (interval totals are made at every decision)
_floats = cast("Callable[[], array[float]]", partial(array, "d"))


@dataclass
class TenantTotals:
    """Counts of one tenant over an episode, and its completions' latencies."""

    arrived: int = 0
    completed: int = 0
    dropped: int = 0  # waited longer than the queue timeout
    rejected: int = 0  # found the queue full
    slo_violations: int = 0  # completed, but over a p99 objective taken per request (the reward's term)
    good: int = 0  # completed and met every per-request objective (core/slo.py): what goodput counts
    output_tokens: int = 0  # of the completed requests
    # per completion; array('d'): appends as fast as a list's, and numpy reads it without converting
    e2e: array[float] = field(default_factory=_floats)
    ttft: array[float] = field(default_factory=_floats)
    tpot: array[float] = field(default_factory=_floats)


@dataclass(frozen=True, slots=True)
class RequestColumns:
    """An episode's requests as columns in arrival order: tenant index, arrival, prompt and output tokens, and
    the times of the first token and of the finish (NaN where the episode ended first) and of the admission
    (``dispatched``: the request left the admission queue; NaN for one never admitted); ``inside``, where the
    world knows it, whether each request was in contract as the world ran it (``in_contract``)."""

    tenant: np.ndarray
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    first_token: np.ndarray
    finished: np.ndarray
    dispatched: np.ndarray
    inside: np.ndarray | None = None  # per request, in contract, as the world classified it (None: not known here)

    @classmethod
    def of(cls, requests: Sequence[Request]) -> RequestColumns:
        def col(name: str, dtype: type) -> np.ndarray:
            return np.fromiter((getattr(r, name) for r in requests), dtype=dtype, count=len(requests))

        return cls(col("tenant", np.int64), col("arrival", np.float64), col("prompt_tokens", np.int64),
                   col("output_tokens", np.int64), col("first_token", np.float64), col("finished", np.float64),
                   col("dispatched", np.float64))

    def in_flight(self, n_tenants: int, times: np.ndarray) -> np.ndarray:
        """Each tenant's requests in flight at each of ``times`` (increasing): admitted at or before the time
        and not finished by it (``dispatched <= t < finished``), the count its admission limit governs once the
        events at ``t`` and a decision taken then have been applied. An int64 array, times × tenants."""
        return in_flight_at(self.tenant, self.dispatched, self.finished, n_tenants, times)

    def good(self, bounds: Sequence[tuple[float, float, float]]) -> np.ndarray:
        """Per request, whether it finished within its tenant's per-request (ttft, tpot, e2e) ``bounds``: the
        test the episode's totals count ``good`` by (core/slo.py's ``is_good``, TPOT as core.slo.tpot)."""
        b = np.asarray(bounds, dtype=np.float64)[self.tenant]
        done = np.isfinite(self.finished)
        e2e = self.finished - self.arrival
        ttft = self.first_token - self.arrival
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(self.output > 1, (e2e - ttft) / np.maximum(self.output - 1, 1), 0.0)
        return done & (ttft <= b[:, 0]) & (tpot <= b[:, 1]) & (e2e <= b[:, 2])


def in_flight_at(tenant: np.ndarray, admitted_at: np.ndarray, finished_at: np.ndarray, n_tenants: int,
                 times: np.ndarray) -> np.ndarray:
    """Each tenant's requests in flight at each of ``times`` (increasing) from per-request columns: the tenant's
    index, when it was admitted (not finite: never) and when it finished (NaN: never); a request counts at a time
    when ``admitted_at <= t < finished_at``. An int64 array, times × tenants. `RequestColumns.in_flight` on a
    simulated episode's requests; a live run's (admit.live.protocol) on the gateway's request log."""
    m = len(times)
    admitted = np.isfinite(admitted_at)
    base = tenant[admitted] * (m + 1)
    # the first time that counts the request and the first that no longer does (m: none, never finished)
    first = _first_at_or_after(times, admitted_at[admitted])
    done = finished_at[admitted]
    last = _first_at_or_after(times, np.where(np.isnan(done), np.inf, done))
    steps = np.bincount(base + first, minlength=n_tenants * (m + 1))
    steps -= np.bincount(base + last, minlength=n_tenants * (m + 1))
    return np.cumsum(steps.reshape(n_tenants, m + 1)[:, :m], axis=1).T.copy()


def _first_at_or_after(times: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``np.searchsorted(times, x, side="left")`` for increasing ``times`` (the first index whose time is at or
    after each x; ``len(times)`` for none): guessed from the mean spacing, which on evenly spaced decision times
    is right or one off, checked for every x and corrected (searched) where wrong, so exact for any times, and
    several times faster than the search on an episode's requests."""
    m = len(times)
    if m < 2:
        return np.searchsorted(times, x, side="left")
    step = (times[-1] - times[0]) / (m - 1)
    if not step > 0:
        return np.searchsorted(times, x, side="left")
    j = np.clip(np.ceil((x - times[0]) / step), 0, m).astype(np.int64)
    above = np.append(times, np.inf)  # above[j] = times[j], inf past the end
    below = np.insert(times, 0, -np.inf)  # below[j] = times[j - 1]
    wrong = ~((below[j] < x) & (x <= above[j]))
    if wrong.any():
        j[wrong] = np.searchsorted(times, x[wrong], side="left")
    return j


@dataclass(slots=True)
class IntervalCounts:
    """One tenant's counts over one decision interval (``Simulation.take_interval_totals``)."""

    arrived: int = 0
    completed: int = 0
    dropped: int = 0
    rejected: int = 0
    slo_violations: int = 0
    good: int = 0
    output_tokens: int = 0

    def __sub__(self, o: IntervalCounts) -> IntervalCounts:
        return IntervalCounts(self.arrived - o.arrived, self.completed - o.completed, self.dropped - o.dropped,
                              self.rejected - o.rejected, self.slo_violations - o.slo_violations,
                              self.good - o.good, self.output_tokens - o.output_tokens)


def draw_request_columns(scenario: Scenario, seed: int) -> tuple[np.ndarray, ...]:
    """The scenario's requests for ``seed`` as columns in arrival order (ties by tenant): arrival times,
    tenant indices, prompt tokens, output tokens and the uniform service draws.

    One independent stream per tenant, all spawned from the seed, so every policy run on one seed sees the
    same requests (common random numbers) and a tenant's draws do not depend on the other tenants'.
    """
    seed = int(seed)
    streams = np.random.SeedSequence(seed).spawn(len(scenario.tenants))
    times, tenant_ix, prompt, output, u = [], [], [], [], []
    for i, (tc, ss) in enumerate(zip(scenario.tenants, streams, strict=True)):
        rng = np.random.default_rng(ss)
        d = draw_tenant(tc.arrival, tc.prompt_tokens, tc.output_tokens, rng, scenario.horizon_s, seed)
        times.append(d.times)
        tenant_ix.append(np.full(len(d.times), i, dtype=np.int64))
        prompt.append(d.prompt)
        output.append(d.output)
        u.append(d.u_service)
    all_t = np.concatenate(times)
    order = np.lexsort((np.concatenate(tenant_ix), all_t))
    return (all_t[order], *(np.concatenate(c)[order] for c in (tenant_ix, prompt, output, u)))


class Draw(NamedTuple):
    """One episode's requests as the seed draws them, before any policy acts (`draw_request_columns`'s
    columns), and ``inside``: whether each is in its tenant's contract (`in_contract`; None where no tenant has
    a contract). The same for every policy on a seed, so a caller that runs many policies on one seed (the caps
    search) draws it once and hands it to each world; its arrays are read-only."""

    times: np.ndarray
    tenant: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    u_service: np.ndarray
    inside: np.ndarray | None


def draw_episode(scenario: Scenario, seed: int) -> Draw:
    """`Draw` of ``scenario`` on ``seed``: its requests and their contract classes, arrays made read-only."""
    times, tenant, prompt, output, u_service = draw_request_columns(scenario, seed)
    inside = in_contract(scenario, tenant, times, prompt, output) if scenario.has_contracts else None
    draw = Draw(times, tenant, prompt, output, u_service, inside)
    for a in draw:
        if a is not None:
            a.flags.writeable = False
    return draw


def in_contract(scenario: Scenario, tenant: np.ndarray, arrival: np.ndarray, prompt: np.ndarray,
                output: np.ndarray) -> np.ndarray:
    """Per request (columns in arrival order), whether it is in its tenant's contract (`classify_requests` with
    the scenario's contracts). Every request of a tenant without a contract counts as in contract (the
    admission core then has one queue for it)."""
    return classify_requests([t.contract for t in scenario.tenants], tenant, arrival, prompt, output)


def classify_requests(contracts: Sequence[Contract | None], tenant: np.ndarray, arrival: np.ndarray,
                      prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """core/contract.py's ``classify`` of each tenant's requests (``contracts[k]`` is tenant k's, None for no
    contract: all in), from arrivals and sizes alone, compiled: envs/kernels.py's ``contract_classify_all`` runs
    every tenant's envelope in one pass over the requests, so an episode's start pays no Python call per
    request (tests/envs/test_contracts.py compares it with ``classify`` flag for flag)."""
    from admit.envs.kernels import contract_classify_all  # loads numba: only where there are contracts

    n = len(contracts)
    rate, burst = np.zeros(n), np.ones(n)
    tokens = np.zeros(n, dtype=bool)  # whose contract counts tokens
    for k, c in enumerate(contracts):
        if c is not None:
            rate[k], burst[k] = c.rate, float(max(1, math.ceil(c.burst)))
            tokens[k] = c.unit == "tokens"
    ten = np.ascontiguousarray(tenant, dtype=np.int64)
    t_arr = np.ascontiguousarray(arrival, dtype=np.float64)
    if t_arr.size > 1 and bool(np.any(np.diff(t_arr) < 0)):
        raise ValueError("contract classification needs the requests in arrival order (non-decreasing times)")
    sizes = np.asarray(prompt, dtype=np.int64) + np.asarray(output, dtype=np.int64)
    cost = np.where(tokens[ten], sizes, 1).astype(np.float64)
    flags = np.empty(len(ten), dtype=np.bool_)
    contract_classify_all(t_arr, ten, cost, rate, burst, np.full(n, math.nan), flags)
    return flags


def draw_requests(scenario: Scenario, seed: int) -> list[Request]:
    """The scenario's requests for ``seed``, in arrival order (``draw_request_columns`` as Request objects):
    what an episode on it serves."""
    times, *cols = draw_request_columns(scenario, seed)
    return [
        Request(rid, ten, t, p, o, uu)
        for rid, (t, ten, p, o, uu) in enumerate(zip(times.tolist(), *(c.tolist() for c in cols), strict=True))
    ]


def _fresh_requests(requests: Sequence[Request], n_tenants: int) -> list[Request]:
    """Unserved copies of ``requests`` (a run fills in their timestamps), checked for what ``advance`` assumes."""
    out = [Request(r.rid, r.tenant, r.arrival, r.prompt_tokens, r.output_tokens, r.u_service) for r in requests]
    for a, b in itertools.pairwise(out):
        if b.arrival < a.arrival:
            raise ValueError(f"requests must be in arrival order: request {b.rid} at {b.arrival} after {a.arrival}")
    for r in out:
        if not 0 <= r.tenant < n_tenants:
            raise ValueError(f"request {r.rid} names tenant {r.tenant}; the scenario has tenants 0..{n_tenants - 1}")
    return out


END_EPS_S = 1e-9  # a run has reached its end when less than this is left (interval sums are rounded)


def decision_count(scenario: Scenario, until: float | None = None) -> int:
    """How many decisions ``Simulation.run`` makes from t = 0 to ``until`` (default: the horizon) — the
    episode's length in env steps, ⌈horizon / interval⌉. Counted on ``step``'s own float arithmetic, so it is
    exact even where the interval does not divide the horizon in binary."""
    end = scenario.horizon_s if until is None else until
    t, n = 0.0, 0
    while t < end - END_EPS_S:
        t = min(t + scenario.interval_s, end)
        n += 1
    return n


def decision_times(scenario: Scenario, until: float | None = None) -> np.ndarray:
    """The times of the decisions ``Simulation.run`` makes from t = 0 to ``until`` (default: the horizon), on
    ``decision_count``'s arithmetic: 0, then each interval on, the last cut at ``until``."""
    end = scenario.horizon_s if until is None else until
    # 0, Δ, Δ + Δ, ...: a running sum adds one interval at a time, as ``step`` does (only the last interval is
    # cut at ``end``, and no decision starts there)
    sums = np.cumsum(np.full(math.ceil(end / scenario.interval_s) + 2, float(scenario.interval_s)))
    times = np.concatenate(([0.0], sums))
    return times[: int(np.searchsorted(times, end - END_EPS_S, side="left"))]


class Simulation:
    def __init__(self, scenario: Scenario, seed: int, *, requests: Sequence[Request] | None = None,
                 warmup_s: float = 0.0) -> None:
        """The world of ``scenario`` at t = 0, on the seed's requests or on ``requests`` (copied, never mutated).

        ``requests`` must be in arrival order and name the scenario's tenants by index; the seed still
        seeds everything else (the engine's random service times come from each request's ``u_service``).
        ``warmup_s``: requests that arrive before it are served like any other but counted in
        ``warmup_totals``, not ``totals`` (so in no summary, whose rates are over ``horizon_s - warmup_s``),
        as `admit loadgen`'s warm-up counts them apart.
        """
        if not 0 <= warmup_s < scenario.horizon_s:
            raise ValueError(f"warmup_s must be >= 0 and < the horizon ({scenario.horizon_s:g} s), got {warmup_s}")
        self.warmup_s = float(warmup_s)
        self.scenario = scenario
        self.spec = scenario.control_spec()
        self.seed = int(seed)
        self.now = 0.0
        n = len(scenario.tenants)
        self.horizon_s = scenario.horizon_s

        # --- workload: the seed's draws, or the caller's requests
        self._requests = draw_requests(scenario, self.seed) if requests is None else _fresh_requests(requests, n)
        self._next = 0
        # per request, in arrival order: whether it is in its tenant's contract (all of them without contracts)
        self._in_contract: list[bool] = [True] * len(self._requests)
        # per tenant: its in-contract requests arrived, good and missed (``contract_totals``), counted only where
        # some tenant has a contract: the counting event handlers replace the plain ones then, so a scenario
        # without contracts runs the same code as before them
        self._contract = [[0, 0, 0] for _ in range(n)]
        self._contracted = np.array([t.contract is not None for t in scenario.tenants])
        if scenario.has_contracts:
            c = RequestColumns.of(self._requests)
            self._in_contract = in_contract(scenario, c.tenant, c.arrival, c.prompt, c.output).tolist()
            self._excess = {id(r) for r, inside in zip(self._requests, self._in_contract, strict=True) if not inside}
            self._arrive = self._arrive_counted  # type: ignore[method-assign]
            self._drop = self._drop_counted  # type: ignore[method-assign]
            self._finish = self._finish_counted  # type: ignore[method-assign]

        # --- the server and the admission core in front of it
        self.engine = make_engine(scenario)
        lim = scenario.limits
        self.core = AdmissionCore(
            [QueueConfig(limit=lim.initial, max_queue=scenario.max_queue(i), queue_timeout_s=scenario.queue_timeout(i))
             for i in range(n)],
            clock=self._clock,
        )
        self.windows = [
            TenantWindows(scenario.window_s, (t.slo_e2e_p99_s, t.slo_ttft_p99_s), t.request_bounds)
            for t in self.spec.tenants
        ]
        self._queued_tokens = [0.0] * n  # prompt tokens of each tenant's requests in the admission queue
        self._preemptions = PreemptionWindow(scenario.window_s)
        self.totals = [TenantTotals() for _ in range(n)]
        self.warmup_totals = [TenantTotals() for _ in range(n)]
        self._taken = [IntervalCounts() for _ in range(n)]  # the totals' counts at the last take_interval_totals
        slo = [(t.slo_e2e_p99_s, t.slo_ttft_p99_s) for t in self.spec.tenants]
        self._slo = slo
        self._bounds = [t.request_bounds for t in self.spec.tenants]  # per-request (ttft, tpot, e2e)
        self._bind_per_tenant()

    def _bind_per_tenant(self) -> None:
        """What ``_finish`` needs of each tenant, in one tuple (it runs once per completed request)."""
        self._per_tenant = [(tot, *b, *slo, w.on_completion) for tot, b, slo, w in zip(
            self.totals, self._bounds, self._slo, self.windows, strict=True)]

    def _clock(self) -> float:
        return self.now

    # ------------------------------------------------------------------ control surface
    @property
    def limits(self) -> list[int]:
        return [self.core.limit(i) for i in range(self.core.n_tenants)]

    @property
    def done(self) -> bool:
        """Whether simulated time has reached the horizon (the env truncates the episode there)."""
        return self.now >= self.horizon_s - END_EPS_S

    @property
    def requests(self) -> list[Request]:
        """This episode's requests in arrival order; a run fills in their timestamps (``finished`` ...)."""
        return self._requests

    def request_columns(self) -> RequestColumns:
        """This episode's requests as columns in arrival order (``requests`` without the objects)."""
        c = RequestColumns.of(self._requests)
        if not self.scenario.has_contracts:
            return c
        return dataclasses.replace(c, inside=np.array(self._in_contract, dtype=bool))

    @property
    def contract_totals(self) -> np.ndarray:
        """Each tenant's in-contract requests so far (those that count: arrived at or after the warm-up): arrived,
        good, missed (rejected, dropped, or completed but not good); a tenants × 3 int64 array, zero for a tenant
        without a contract. What is neither good nor missed is still queued or running."""
        return np.array(self._contract, dtype=np.int64) * self._contracted[:, None]

    def apply_deltas(self, deltas: Sequence[int]) -> list[int]:
        """Add per-tenant deltas to the limits, clamped to [min, max] (``Limits.apply``); returns the new limits."""
        core = self.core
        out = self.spec.limits.apply(self.limits, deltas)
        for i, new in enumerate(out):
            if new != core.limit(i):
                for payload, _waited in core.set_limit(i, new):
                    self._dispatch(payload)
        return out

    def set_limits(self, limits: Sequence[int]) -> None:
        lim = self.spec.limits
        for i, v in enumerate(limits):
            for payload, _waited in self.core.set_limit(i, lim.clamp(int(v))):
                self._dispatch(payload)

    def _preempted(self) -> float:
        self._preemptions.add(self.now, self.engine.num_preemptions)
        return self._preemptions.count(self.now)

    def _tokens(self) -> TenantTokens:
        prefill, held = self.engine.tenant_tokens(len(self.windows))
        return TenantTokens(list(self._queued_tokens), prefill, held)

    def observe(self) -> Observation:
        eng = self.engine
        eng.sync(self.now)
        return build_observation(
            self.now, self.spec, self.windows, self.core, eng.memory_utilisation(), eng.num_running, eng.num_waiting,
            self._tokens(), self._preempted(),
        )

    def observe_values(self) -> list[float]:
        """``observe()`` as the flat list of its vector's values (``Observation.from_vector`` rebuilds it)."""
        eng = self.engine
        eng.sync(self.now)
        return observation_values(
            self.now, self.windows, self.core, eng.memory_utilisation(), eng.num_running, eng.num_waiting,
            self._tokens(), self._preempted(),
        )

    def take_interval_totals(self) -> list[IntervalCounts]:
        """Counts since the last call (for per-interval rewards): differences of the episode totals, so the
        event paths count once."""
        out = []
        for i, tot in enumerate(self.totals):
            now = IntervalCounts(tot.arrived, tot.completed, tot.dropped, tot.rejected, tot.slo_violations,
                                 tot.good, tot.output_tokens)
            out.append(now - self._taken[i])
            self._taken[i] = now
        return out

    # ------------------------------------------------------------------ the decision loop
    def advance_interval(self, until: float | None = None) -> None:
        """Run the world one ``interval_s`` on, to ``until`` at most (default: the horizon)."""
        end = self.horizon_s if until is None else until
        self.advance(min(self.now + self.scenario.interval_s, end))

    def step(self, deltas: Sequence[int], until: float | None = None) -> list[int]:
        """One decision: apply ``deltas``, then run one interval on (``advance_interval(until)``). Returns the
        limits the deltas set. The env's ``step``."""
        limits = self.apply_deltas(deltas)
        self.advance_interval(until)
        return limits

    def run(
        self,
        controller: Controller,
        until: float | None = None,
        on_decision: OnDecision | None = None,
        name: str | None = None,
    ) -> RunStats:
        """The decision loop (core/loop.py's ``run_loop`` on ``SimulatedWorld(self, until)``): every interval
        observe → ``controller.act`` → ``validate_deltas`` → apply → one interval on.

        Runs from ``now`` until simulated time reaches ``until`` (default: the horizon; later than it runs
        the queues dry, with no arrivals after the horizon). The controller must already be ``reset``.
        ``on_decision(time_s, obs, deltas, new_limits)`` sees every decision (sim2live logs them); the limits
        before it are ``obs``'s. A controller that raises ValueError or returns bad deltas raises ValueError
        naming the policy (``name``, default the controller's) and the decision's time.
        """
        return run_loop(SimulatedWorld(self, until), controller, on_decision, name)

    # ------------------------------------------------------------------ the event loop
    def _dispatch(self, req: Request) -> None:
        """A request leaves the admission queue for the engine."""
        self._queued_tokens[req.tenant] -= req.prompt_tokens
        req.dispatched = self.now
        self.engine.submit(req, self.now)

    def advance(self, until: float) -> None:
        reqs = self._requests
        n = len(reqs)
        eng = self.engine
        core = self.core
        next_event = eng.next_event_time
        next_deadline = core.next_deadline
        finish = self._finish
        arrive = self._arrive
        inside = self._in_contract
        inf = math.inf
        i = self._next
        ta = reqs[i].arrival if i < n else inf
        while True:
            te = next_event()
            td = next_deadline()
            t = ta if ta < te else te
            if td < t:
                t = td
            if t > until:
                break
            if t < self.now:  # queued items found late: handle them now
                t = self.now
            self.now = t
            if te <= ta and te <= td:
                for r in eng.process_event(t):
                    finish(r, t)
            elif td <= ta:
                for tenant, r, _waited in core.expire():
                    self._drop(tenant, r, t)
            else:
                r = reqs[i]
                inc = inside[i]
                i += 1
                self._next = i
                ta = reqs[i].arrival if i < n else inf
                arrive(r, t, inc)
        self.now = until

    def _arrive(self, r: Request, t: float, in_contract: bool) -> Offer:
        k = r.tenant
        tot = self.totals[k] if r.arrival >= self.warmup_s else self.warmup_totals[k]
        tot.arrived += 1
        self.windows[k].on_arrival(t)
        res = self.core.offer(k, r, in_contract)
        if res is Offer.ADMITTED:
            r.dispatched = t
            self.engine.submit(r, t)
        elif res is Offer.QUEUED:
            self._queued_tokens[k] += r.prompt_tokens
        elif res is Offer.REJECTED:
            tot.rejected += 1
            self.windows[k].on_rejection(t)
        return res

    def _drop(self, k: int, r: Request, t: float) -> None:
        self._queued_tokens[k] -= r.prompt_tokens
        (self.totals[k] if r.arrival >= self.warmup_s else self.warmup_totals[k]).dropped += 1
        self.windows[k].on_drop(t)

    def _finish(self, r: Request, t: float) -> bool:
        k = r.tenant
        tot, b_ttft, b_tpot, b_e2e, slo_e2e, slo_ttft, on_completion = self._per_tenant[k]
        arrival = r.arrival
        if arrival < self.warmup_s:
            tot = self.warmup_totals[k]
        e2e = t - arrival
        ttft = r.first_token - arrival
        out = r.output_tokens
        per_token = (e2e - ttft) / (out - 1) if out > 1 else 0.0  # core.slo.tpot, inlined on the hot path
        tot.completed += 1
        tot.output_tokens += out
        tot.e2e.append(e2e)
        tot.ttft.append(ttft)
        tot.tpot.append(per_token)
        good = ttft <= b_ttft and per_token <= b_tpot and e2e <= b_e2e  # core.slo.is_good
        if good:
            tot.good += 1
        if e2e > slo_e2e or ttft > slo_ttft:
            tot.slo_violations += 1
        on_completion(t, e2e, ttft, r.dispatched - arrival, per_token, out, good)
        nxt = self.core.release(k)
        if nxt is not None:
            self._dispatch(nxt[0])
        return good

    # the event handlers where some tenant has a contract: the plain ones, and the in-contract counts
    def _arrive_counted(self, r: Request, t: float, in_contract: bool) -> Offer:
        res = Simulation._arrive(self, r, t, in_contract)
        if in_contract and r.arrival >= self.warmup_s:
            c = self._contract[r.tenant]
            c[0] += 1
            if res is Offer.REJECTED:
                c[2] += 1
        return res

    def _drop_counted(self, k: int, r: Request, t: float) -> None:
        Simulation._drop(self, k, r, t)
        if id(r) not in self._excess and r.arrival >= self.warmup_s:
            self._contract[k][2] += 1

    def _finish_counted(self, r: Request, t: float) -> bool:
        good = Simulation._finish(self, r, t)
        if id(r) not in self._excess and r.arrival >= self.warmup_s:
            self._contract[r.tenant][1 if good else 2] += 1
        return good

    # ------------------------------------------------------------------ results
    def summary(self) -> dict[str, float]:
        """Episode metrics over all tenants: goodput and attainment, throughput, latency percentiles, drops,
        Jain's fairness (`episode_metrics`)."""
        return episode_metrics(self.totals, self.horizon_s - self.warmup_s)

    def tenant_summary(self) -> dict[str, dict[str, float]]:
        """`tenant_metrics` of every tenant, by name."""
        span = self.horizon_s - self.warmup_s
        return {t.name: tenant_metrics(tot, span) for t, tot in zip(self.spec.tenants, self.totals, strict=True)}


class SimulatedWorld:
    """A simulated world (``Simulation`` or ``CompiledSimulation``) from its ``now`` to ``until`` (default: the
    horizon) as core/loop.py's ``World``: a decision is due until then, observe is the world's, apply is
    ``apply_deltas`` and advance is one interval on."""

    def __init__(self, sim: Simulation | CompiledSimulation, until: float | None = None) -> None:
        self.sim = sim
        self.spec = sim.spec
        self.end = sim.horizon_s if until is None else until

    @property
    def now(self) -> float:
        return self.sim.now

    def due(self) -> bool:
        return self.sim.now < self.end - END_EPS_S

    def observe(self) -> Observation:
        return self.sim.observe()

    def apply(self, deltas: list[int]) -> list[int]:
        return self.sim.apply_deltas(deltas)

    def advance(self) -> None:
        self.sim.advance_interval(self.end)


def tenant_metrics(t: TenantTotals, horizon_s: float) -> dict[str, float]:
    """One tenant's episode: goodput (good requests/s), attainment (good / arrived: drops and rejections
    count against it), throughput, TTFT/TPOT/e2e p50 and p99 of its completions, drops, rejections."""
    ttft_p50, ttft_p99 = linear_np_many(t.ttft, (50, 99)) if t.ttft else (0.0, 0.0)
    tpot_p50, tpot_p99 = linear_np_many(t.tpot, (50, 99)) if t.tpot else (0.0, 0.0)
    e2e_p50, e2e_p99 = linear_np_many(t.e2e, (50, 99)) if t.e2e else (0.0, 0.0)
    return {
        "goodput_rps": t.good / horizon_s,
        "attainment": t.good / t.arrived if t.arrived else 1.0,
        "throughput_rps": t.completed / horizon_s,
        "output_tokens_per_s": t.output_tokens / horizon_s,
        "ttft_p50_s": ttft_p50,
        "ttft_p99_s": ttft_p99,
        "tpot_p50_s": tpot_p50,
        "tpot_p99_s": tpot_p99,
        "e2e_p50_s": e2e_p50,
        "e2e_p99_s": e2e_p99,
        "timeouts": float(t.dropped),
        "rejected": float(t.rejected),
        "arrived": float(t.arrived),
        "completed": float(t.completed),
        "good": float(t.good),
    }


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all are equal, 1/n when one has everything."""
    sq = sum(x * x for x in values)
    return (sum(values) ** 2 / (len(values) * sq)) if values and sq > 0 else 1.0


def episode_metrics(totals: Sequence[TenantTotals], horizon_s: float) -> dict[str, float]:
    """Over all tenants. ``goodput_rps`` and ``attainment`` first (what an evaluation judges by), with the
    worst tenant's attainment and Jain's index over the tenants' attainments (tenants that saw no request
    left out); then the seed study's figures: throughput, e2e p50/p99, drops, its SLO attainment
    (``slo_attainment``: completions within the p99 objectives taken per request) and Jain's index over the
    tenants' served shares."""
    completed = sum(t.completed for t in totals)
    arrived = sum(t.arrived for t in totals)
    good = sum(t.good for t in totals)
    attain = [t.good / t.arrived for t in totals if t.arrived > 0]
    all_e2e = np.concatenate([np.frombuffer(t.e2e) for t in totals]) if totals else np.zeros(0)
    all_ttft = np.concatenate([np.frombuffer(t.ttft) for t in totals]) if totals else np.zeros(0)
    met = sum(t.completed - t.slo_violations for t in totals)
    served = [t.completed / t.arrived for t in totals if t.arrived > 0]
    jain_served = (sum(served) ** 2 / (len(served) * sum(x * x for x in served))) if served and any(served) else 1.0
    all_tpot = np.concatenate([np.frombuffer(t.tpot) for t in totals]) if totals else np.zeros(0)
    e2e_p50, e2e_p99 = linear_np_many(all_e2e, (50, 99)) if len(all_e2e) else (0.0, 0.0)
    ttft_p50, ttft_p99 = linear_np_many(all_ttft, (50, 99)) if len(all_ttft) else (0.0, 0.0)
    tpot_p50, tpot_p99 = linear_np_many(all_tpot, (50, 99)) if len(all_tpot) else (0.0, 0.0)
    out = {
        "throughput_rps": completed / horizon_s,
        "p99_s": e2e_p99,
        "p50_s": e2e_p50,
        "ttft_p99_s": ttft_p99,
        "dropped": float(sum(t.dropped + t.rejected for t in totals)),
        "timeouts": float(sum(t.dropped for t in totals)),
        "rejected": float(sum(t.rejected for t in totals)),
        "arrived": float(arrived),
        "completed": float(completed),
        "slo_attainment": met / arrived if arrived else 1.0,
        "jain_fairness": jain_served,
        "goodput_rps": good / horizon_s,
        "attainment": good / arrived if arrived else 1.0,
        "worst_attainment": min(attain) if attain else 1.0,
        "jain_attainment": jain(attain),
        "ttft_p50_s": ttft_p50,
        "tpot_p50_s": tpot_p50,
        "tpot_p99_s": tpot_p99,
    }
    return out

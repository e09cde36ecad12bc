"""``admit search-static``: the search for per-tenant static caps with the most goodput, and its simulator objective.

``search_static`` searches a scenario's caps by **coordinate descent** on the per-tenant caps over a log grid
per tenant ({min, 1, 2, 4, ..., max} ∪ {initial}, clipped to the scenario's bounds). A sweep tries values of
one tenant's cap while the others stay put, tenant after tenant: in the first round every value of the grid,
in later rounds (the others have moved, not far) the ``window`` values on either side of the current one. It
stops once n sweeps in a row (n tenants) moved nothing. Then (``refine``) the same on the grid with its ×1.5
midpoints (3, 6, 12, 24, ...), trying only the current value's neighbours. The objective is the mean goodput
(requests/s that met every per-request objective, ``Simulation.summary()["goodput_rps"]``) over the tuning
seeds, every candidate on the same seeds (common random numbers), each episode run by
`admit.envs.rollout.rollout` with the static controller at the caps: the function ``admit evaluate`` runs.
Among a sweep's candidates with the best goodput (exactly equal unless ``rel_tol`` allows more; caps that
never bind give identical episodes) the smallest cap wins, so the caps are as cheap as the goodput allows;
with ``rel_tol = 0`` every move strictly improves (goodput, −cap), so the descent cannot cycle.

Speed: every episode is cached per (caps, seed), so a sweep that revisits points costs nothing; an episode
whose caps exceed those of one already run in a single tenant whose limit never held a request back is the
same episode (every limit is at least as high at every decision, so nothing is held back either), and is
filled in without running (``inferred`` in the record); candidates run in a process pool of ``workers``;
and a sweep **races** its candidates seed by seed: after each seed, a candidate whose goodput so far is more
than ``race_margin`` (2%) below the leader's is dropped (recorded as pruned, never chosen; ``race_margin =
0`` runs every candidate on every seed). Under common random numbers the seeds rank caps alike, so racing
ends at the caps of the unraced search with fewer episodes (docs/controllers.md).

**Under contracts** (``objective="contract"``, static:contract): the score is the mean goodput less
``BROKEN_PENALTY`` per promise broken and ``CONTRACT_PENALTY`` (1000 req/s) per in-contract request short of a
promise per seed, each tenant's promise judged on its in-contract requests pooled over the tuning seeds
(core/contract.py); so caps that keep more promises always win, then caps short by fewer requests, and among
caps that keep them all the most goodput does (the smallest caps on ties).
The race is off there: it compares goodput alone and could drop the only caps that keep a promise.

The result is a tuning store (`SearchResult.to_json`, written by `write_store`; `fingerprint` names the scenario it
was tuned on) that admit.agents.static_best reads: static:best deploys it. train/worlds.py's ``pool_caps``
runs the same search for training targets (an anchored policy's anchors, imitation's expert).

**The ramp.** A static controller moves a limit by at most ``max_step`` per decision, so caps other than
the scenario's ``initial`` are reached after ⌈|cap − initial| / max_step⌉ decisions (h200-mixed:
64 → 8 in 14 decisions, 28 s of 1800 s). The search tunes what is deployed in evaluation, ramp included;
each tuning also measures the same caps started *at* the caps (``Simulation.set_limits`` at t = 0, as an
operator's quota is set before traffic) on the same seeds and records the difference (``ramp`` in the JSON).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from admit.controllers.static import StaticController
from admit.core.contract import figures as contract_figures
from admit.core.spec import ControlSpec, Limits
from admit.engine.presets import install, override_of, overrides
from admit.envs.scenario import Scenario, TokenEngineConfig, load_scenario

if TYPE_CHECKING:
    from admit.envs.compiled import World
    from admit.envs.simulation import Draw

Caps = tuple[int, ...]

SearchGoal = Literal["goodput", "contract"]
"""What a search maximises: goodput (static:best, tenant-blind), or goodput among the caps that keep every
contract (static:contract; the module docstring)."""

Objective = Callable[[Sequence[Caps]], list[float]]
"""The search's objective: the scores of a batch of cap vectors, higher is better; ``-inf`` for a candidate
that was dropped (never chosen)."""

# what the record keeps of each episode (rollout returns more)
KEPT_METRICS = (
    "goodput_rps",
    "attainment",
    "worst_attainment",
    "jain_attainment",
    "throughput_rps",
    "dropped",
    "mean_limit",
    "ttft_p99_s",
    "tpot_p99_s",
)


CONTRACT_COUNTS = ("contract_arrived", "contract_good")  # per tenant with a contract: what the promise is judged on
CONTRACT_PENALTY = 1000.0  # req/s of goodput one in-contract request short of a promise (per seed) outweighs
BROKEN_PENALTY = 1e9  # one promise broken outweighs any shortfall (an episode's requests, ~1e5 at most) and goodput

SEARCH_SEEDS: tuple[int, ...] = tuple(range(900_000, 900_005))
"""The seeds static:best's caps are tuned on: ``admit evaluate``'s seeds 0..N-1, the training env's validation
seeds (500000 + j) and its episode seeds (1000000 + ...) never reach them."""
STORE_FORMAT = 1
_FINGERPRINT_EXCLUDES = {"name", "description", "reward"}  # change nothing in an episode


def fingerprint(scenario: Scenario, objective: SearchGoal = "goodput") -> str:
    """sha256 of the scenario's parsed content as set (``exclude_unset``: a field the schema gains later, with
    a default, does not make every stored tuning stale), without its name, description and reward weights;
    a search under the contracts (``objective="contract"``) is told apart from the tenant-blind one."""
    data = scenario.model_dump(mode="json", exclude_unset=True, exclude=_FINGERPRINT_EXCLUDES)
    payload: dict[str, Any] = {"fingerprint": 1, "scenario": data}
    if objective != "goodput":
        payload["objective"] = objective
    engine = scenario.engine
    if isinstance(engine, TokenEngineConfig) and (other := override_of(engine.preset)) is not None:
        payload["preset"] = asdict(other)  # the same scenario on another engine (a calibrated fit): other caps
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def spec_fingerprint(spec: ControlSpec) -> str:
    """sha256 of the control spec: how an unbound static:best, which sees only the spec, finds a stored tuning."""
    data = asdict(spec)
    for t, ts in zip(data["tenants"], spec.tenants, strict=True):
        for k in ("contract", "contract_load", "min_limit"):  # fields gained later: absent when unset, as before
            if t[k] is None:
                del t[k]
        if ts.contract is not None:
            t["contract"] = ts.contract.model_dump(mode="json", exclude_none=True)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def parse_seeds(text: str) -> list[int]:
    """``A..B`` (inclusive), ``A`` or ``A,B,C`` → the seeds; raises ValueError saying what is allowed."""

    def number(x: str) -> int:
        try:
            v = int(x)
        except ValueError:
            raise ValueError(f"seeds {text!r}: give A..B (inclusive), A, or A,B,C, with integers >= 0") from None
        if v < 0:
            raise ValueError(f"seeds {text!r}: seeds must be >= 0")
        return v

    if ".." in text:
        lo, _, hi = text.partition("..")
        a, b = number(lo), number(hi)
        if b < a:
            raise ValueError(f"seeds {text!r}: the range A..B needs A <= B")
        return list(range(a, b + 1))
    seeds = [number(x) for x in text.split(",")]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {text!r}: every seed at most once")
    return seeds


def format_seeds(seeds: Sequence[int]) -> str:
    """The spelling ``parse_seeds`` reads: ``A..B`` for a run of consecutive seeds, else ``A,B,C``."""
    s = list(seeds)
    if len(s) > 1 and s == list(range(s[0], s[0] + len(s))):
        return f"{s[0]}..{s[-1]}"
    return ",".join(str(x) for x in s)


def static_policy(caps: Sequence[int]) -> str:
    """The plain static policy that holds ``caps``: what static:best runs, by another name."""
    return "static:" + ",".join(str(int(c)) for c in caps)



def write_store(data: dict[str, Any], path: Path) -> Path:
    """Write a tuning's JSON atomically (a reader never sees half a file; two writers leave one whole file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return path




# ---------------------------------------------------------------------------------------------- grids
def log_grid(limits: Limits) -> list[int]:
    """{min, 1, 2, 4, ..., max} ∪ {initial} within [min, max], sorted."""
    vals = {limits.min, limits.max, limits.initial}
    p = 1
    while p < limits.max:
        if p >= limits.min:
            vals.add(p)
        p *= 2
    return sorted(vals)


def fine_grid(grid: Sequence[int]) -> list[int]:
    """``grid`` with a midpoint in every gap: ×1.5 between a power-of-two step (4 → 6 → 8), the geometric mean
    elsewhere, rounded; a gap of 1 has none."""
    g = sorted(set(grid))
    out = set(g)
    for a, b in itertools.pairwise(g):
        mid = round(1.5 * a) if b == 2 * a else round(math.sqrt(a * b)) if a > 0 else (b + 1) // 2
        if a < mid < b:
            out.add(mid)
    return sorted(out)


Candidates = Callable[[int, int, int], Sequence[int]]
"""``candidates(tenant, current value, round)``: the values a sweep of that tenant tries (rounds count from 1)."""


def log_sweep(grids: Sequence[Sequence[int]], window: int | None = 2) -> Candidates:
    """Round 1 tries every value of the tenant's grid; later rounds (the others have moved, not far) only the
    ``window`` grid values on either side of the current one (None: the whole grid every round)."""

    def cands(i: int, v: int, rnd: int) -> list[int]:
        return _window(grids[i], v, None if rnd == 1 else window)

    return cands


def adjacent(grids: Sequence[Sequence[int]]) -> Candidates:
    """The current value and its neighbours on the tenant's grid, every round: a local search."""
    return lambda i, v, rnd: _window(grids[i], v, 1)


def _window(grid: Sequence[int], v: int, width: int | None) -> list[int]:
    g = sorted(set(grid) | {v})
    if width is None:
        return g
    k = g.index(v)
    return g[max(0, k - width) : k + width + 1]


# ---------------------------------------------------------------------------------------------- the search core
@dataclass
class Sweep:
    """One coordinate sweep: tenant ``tenant``'s candidates with the others at ``start``'s values."""

    stage: str
    round: int
    tenant: int
    start: Caps
    end: Caps
    scores: dict[int, float]  # candidate value of the tenant's cap → score (-inf: dropped)

    @property
    def moved(self) -> bool:
        return self.start != self.end


@dataclass
class Descent:
    best: Caps
    score: float
    sweeps: list[Sweep]
    rounds: int
    converged: bool  # a whole round of tenants in a row made no move (else max_rounds stopped it)
    stage: str = "grid"


def coordinate_descent(
    objective: Objective,
    start: Sequence[int],
    candidates: Candidates,
    *,
    max_rounds: int = 10,
    rel_tol: float = 0.0,
    stage: str = "grid",
    on_sweep: Callable[[Sweep], None] | None = None,
) -> Descent:
    """Maximize ``objective`` one coordinate at a time from ``start``.

    A sweep of tenant i scores ``candidates(i, current[i], round)`` (the others fixed) and moves to the smallest value
    whose score is within ``rel_tol`` (relative) of the sweep's best. The descent stops once n sweeps in a row
    (n = number of tenants) made no move — every coordinate is then optimal given the others — or after
    ``max_rounds`` rounds. The core knows nothing of the simulator: ``objective`` is any batch scorer.
    """
    n = len(start)
    if n == 0:
        raise ValueError("coordinate descent needs at least one coordinate")
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    if rel_tol < 0:
        raise ValueError(f"rel_tol must be >= 0, got {rel_tol}")
    current: Caps = tuple(int(v) for v in start)
    (score,) = objective([current])
    if not math.isfinite(score):
        raise ValueError(f"the objective of the start point {list(current)} is {score}, not a number")
    sweeps: list[Sweep] = []
    idle = 0
    rounds = 0
    while idle < n and rounds < max_rounds:
        rounds += 1
        for i in range(n):
            values = sorted({int(v) for v in candidates(i, current[i], rounds)} | {current[i]})
            points = [(*current[:i], v, *current[i + 1 :]) for v in values]
            scores = objective(points)
            if len(scores) != len(points):
                raise ValueError(f"the objective returned {len(scores)} scores for {len(points)} points")
            top = max(scores)
            floor = top - rel_tol * abs(top)
            choice = min((p for p, s in zip(points, scores, strict=True) if s >= floor), key=lambda p: p[i])
            sweep = Sweep(stage, rounds, i, current, choice, dict(zip(values, scores, strict=True)))
            sweeps.append(sweep)
            if on_sweep is not None:
                on_sweep(sweep)
            if choice != current:
                current, score, idle = choice, sweep.scores[choice[i]], 0
            else:
                idle += 1
                if idle >= n:
                    break
    return Descent(current, score, sweeps, rounds, idle >= n, stage)


# ---------------------------------------------------------------------------------------------- the simulator
def static_at(caps: Sequence[int]) -> StaticController:
    """The static controller at ``caps``, named as the registry names it (``static:c1,c2,...``)."""
    ctrl = StaticController(list(caps))
    ctrl.name = static_policy(caps)
    return ctrl


def _searched(sim: World) -> dict[str, Any]:
    """What the search reads of a finished episode besides its summary: ``bound``, per tenant whether its limit
    ever held a request back (a request that waited for admission, was rejected or dropped, or was still queued
    at the end), and under contracts each tenant's in-contract requests arrived and good (the world's own
    counts, ``contract_totals``: the episode's contract figures count the same requests)."""
    c = sim.request_columns()  # arrays, not a Request object per request: that cost most of a search's time
    held = (c.arrival <= sim.now) & (c.dispatched != c.arrival)  # NaN (never admitted) is unequal too
    out: dict[str, Any] = {"bound": (np.bincount(c.tenant[held], minlength=len(sim.scenario.tenants)) > 0).tolist()}
    if sim.scenario.has_contracts:
        totals = sim.contract_totals
        out["contract_counts"] = {t.name: dict(zip(CONTRACT_COUNTS, map(float, totals[k, :2].tolist()), strict=True))
                                  for k, t in enumerate(sim.scenario.tenants) if t.contract is not None}
    return out


_DRAWS: OrderedDict[tuple[str, int], Draw] = OrderedDict()
_DRAWS_KEPT = 10  # a search's seeds (5 at most by default) with room for a second scenario's


def _draw(scenario: Scenario, key: str, seed: int) -> Draw:
    """The seed's requests for ``scenario`` (fingerprint ``key``), drawn once per process and kept for the
    search's other candidates on that seed (the few most recent)."""
    from admit.envs.simulation import draw_episode

    k = (key, int(seed))
    if k in _DRAWS:
        _DRAWS.move_to_end(k)
        return _DRAWS[k]
    d = _DRAWS[k] = draw_episode(scenario, seed)
    while len(_DRAWS) > _DRAWS_KEPT:
        _DRAWS.popitem(last=False)
    return d


def _episode(args: tuple[Scenario, str, Caps, int]) -> dict[str, Any]:
    """One episode of the static caps, by `rollout` on the seed's requests drawn once (`_draw`), its contract
    counts the world's own (`_searched`), reduced to what the record keeps, plus ``bound``."""
    from admit.envs.rollout import rollout  # imported on use: the compiled world loads numba

    scenario, key, caps, seed = args
    ep = rollout(scenario, static_at(caps), seed, inspect=_searched, draw=_draw(scenario, key, seed),
                 per_request=False)
    out: dict[str, Any] = {k: float(ep[k]) for k in KEPT_METRICS if k in ep}
    counts = ep.get("contract_counts", {})
    out["tenants"] = {
        name: {"goodput_rps": float(v["goodput_rps"]), "attainment": float(v["attainment"]), **counts.get(name, {})}
        for name, v in ep["tenants"].items()
    }
    out["bound"] = ep["bound"]
    return out


def mean_limit(scenario: Scenario, caps: Sequence[int]) -> float:
    """The ``mean_limit`` of an episode of ``static:CAPS``: the limits walk from ``initial`` to the caps by at
    most ``max_step`` a decision, whatever the traffic, so it follows from the scenario alone."""
    from admit.envs.simulation import decision_count

    lim = scenario.control_spec().limits
    n = decision_count(scenario)
    total = sum(_limit_sum(lim, lim.clamp(int(c)), n) for c in caps)
    return total / max(n, 1) / len(caps)


@functools.lru_cache(maxsize=4096)
def _limit_sum(lim: Limits, target: int, n: int) -> int:
    """One tenant's limits summed over ``n`` decisions of a static controller holding ``target`` (`mean_limit`)."""
    limit, total = lim.initial, 0
    for _ in range(n):
        (limit,) = lim.apply([limit], [max(-lim.max_step, min(lim.max_step, target - limit))])
        total += limit
    return total


def _episode_at_caps(args: tuple[Scenario, str, Caps, int]) -> float:
    """Goodput of ``caps`` set at t = 0 (no ramp from ``initial``): what the ramp costs, for the record."""
    from admit.envs.rollout import rollout

    scenario, key, caps, seed = args
    ep = rollout(scenario, static_at(caps), seed, start_limits=caps, draw=_draw(scenario, key, seed),
                 per_request=False)
    return float(ep["goodput_rps"])


class SimObjective:
    """Mean goodput of static caps over the tuning seeds, cached per (caps, seed), raced, run in a pool."""

    def __init__(
        self,
        scenario: Scenario,
        seeds: Sequence[int],
        pool: Executor | None,
        workers: int,
        race_margin: float = 0.02,
        progress: Callable[[int], None] | None = None,
        objective: SearchGoal = "goodput",
    ) -> None:
        if not seeds:
            raise ValueError("give at least one tuning seed")
        if not 0 <= race_margin < 1:
            raise ValueError(f"race_margin must be in [0, 1), got {race_margin}")
        if objective == "contract" and not scenario.has_contracts:
            raise ValueError(f"scenario {scenario.name!r} has no contracts to search under; search for goodput")
        self.kind: SearchGoal = objective
        self.scenario = scenario
        self.key = fingerprint(scenario)  # names the scenario's drawn requests in a worker (`_draw`)
        self.seeds = [int(s) for s in seeds]
        self.pool = pool
        self.workers = workers
        self.race_margin = race_margin
        self.progress = progress
        self.episodes: dict[tuple[Caps, int], dict[str, Any]] = {}
        self.pruned: set[Caps] = set()
        self.rollouts = 0  # episodes run
        self.inferred = 0  # episodes filled in from a run one whose limit never bound (`_infer`)

    def _run(self, jobs: Iterable[tuple[Caps, int]]) -> None:
        todo = []
        for job in dict.fromkeys(jobs):
            if job not in self.episodes and not self._infer(job):
                todo.append(job)
        if not todo:
            return
        args = [(self.scenario, self.key, caps, seed) for caps, seed in todo]
        if self.pool is None:
            results: Iterable[dict[str, Any]] = map(_episode, args)
        else:
            results = self.pool.map(_episode, args, chunksize=max(1, len(args) // (4 * self.workers)))
        for job, r in zip(todo, results, strict=True):
            self.episodes[job] = r
            self.rollouts += 1
            if self.progress is not None:
                self.progress(self.rollouts)

    def _infer(self, job: tuple[Caps, int]) -> bool:
        """Fill in ``job`` without running it where an episode already run says how it goes: the same caps but a
        smaller one for some tenant whose limit never held a request back. Every limit of ``job`` is then at
        least that episode's at every decision, so no request is held back either and every event happens at
        the same time: the same episode, but for its ``mean_limit`` (`mean_limit`)."""
        caps, seed = job
        for (other, s), ep in self.episodes.items():
            if s != seed:
                continue
            diff = [i for i, (a, b) in enumerate(zip(other, caps, strict=True)) if a != b]
            if len(diff) == 1 and other[diff[0]] < caps[diff[0]] and not ep["bound"][diff[0]]:
                self.episodes[job] = {**ep, "mean_limit": mean_limit(self.scenario, caps), "inferred_from": list(other)}
                self.inferred += 1
                return True
        return False

    def complete(self, caps: Caps) -> bool:
        return all((caps, s) in self.episodes for s in self.seeds)

    def mean(self, caps: Caps, metric: str = "goodput_rps") -> float:
        return sum(self.episodes[(caps, s)][metric] for s in self.seeds) / len(self.seeds)

    def contracts(self, caps: Caps) -> dict[str, dict[str, float]]:
        """Per tenant with a contract, its figures over the tuning seeds pooled (core/contract.py's ``figures``
        on the summed in-contract arrivals and good requests): met when the pooled attainment keeps the promise."""
        out = {}
        for t in self.scenario.tenants:
            if t.contract is None:
                continue
            runs = [self.episodes[(caps, s)]["tenants"][t.name] for s in self.seeds]
            out[t.name] = contract_figures(t.contract, int(sum(r["contract_arrived"] for r in runs)),
                                           int(sum(r["contract_good"] for r in runs)))
        return out

    def score(self, caps: Caps) -> float:
        """What the search maximises: the mean goodput, less (under the contracts) ``BROKEN_PENALTY`` per promise
        broken and ``CONTRACT_PENALTY`` per in-contract request short of one per seed: caps that keep more promises
        win, then those short by fewer requests, then those with more goodput."""
        good = self.mean(caps)
        if self.kind == "goodput":
            return good
        figs = self.contracts(caps).values()
        broken = sum(1 for f in figs if not f["contract_met"])
        short = sum(f["contract_shortfall"] for f in figs)
        return good - BROKEN_PENALTY * broken - CONTRACT_PENALTY * short / len(self.seeds)

    def __call__(self, points: Sequence[Caps]) -> list[float]:
        """The mean goodput of every point over the seeds; ``-inf`` for a point the race dropped."""
        alive = list(dict.fromkeys(tuple(p) for p in points))
        if self.race_margin > 0 and self.kind == "goodput":  # the race compares goodput alone
            for k in range(len(self.seeds) - 1):  # after the last seed there is nothing left to save
                if len(alive) < 2:
                    break
                self._run((p, self.seeds[k]) for p in alive)
                so_far = {p: sum(self.episodes[(p, s)]["goodput_rps"] for s in self.seeds[: k + 1]) for p in alive}
                floor = (1 - self.race_margin) * max(so_far.values())
                out = {p for p in alive if so_far[p] < floor and not self.complete(p)}
                self.pruned |= out
                alive = [p for p in alive if p not in out]
        self._run((p, s) for p in alive for s in self.seeds)
        self.pruned.difference_update(alive)
        return [self.score(p) if self.complete(p) else -math.inf for p in points]


# ---------------------------------------------------------------------------------------------- search_static
@dataclass
class SearchResult:
    """A finished search: the caps, how they were found, and every episode it ran."""

    scenario: Scenario
    source: str
    seeds: list[int]
    start: Caps
    best: Caps
    descents: list[Descent]
    objective: SimObjective
    wall_s: float
    workers: int
    grids: list[list[int]]
    ramp: dict[str, float] = field(default_factory=dict)

    def point(self, caps: Caps) -> dict[str, Any]:
        """A fully evaluated point's mean metrics over the tuning seeds, per tenant too where offline has them."""
        runs = [self.objective.episodes[(caps, s)] for s in self.seeds]
        out: dict[str, Any] = {"caps": list(caps), "policy": static_policy(caps)}
        out.update({m: _mean(r[m] for r in runs) for m in KEPT_METRICS if all(m in r for r in runs)})
        if all("tenants" in r for r in runs):
            out["tenants"] = {
                t.name: {k: _mean(r["tenants"][t.name][k] for r in runs) for k in ("goodput_rps", "attainment")}
                for t in self.scenario.tenants
            }
        return out

    def to_json(self, command: str) -> dict[str, Any]:
        sc = self.scenario
        names = [t.name for t in sc.tenants]
        ob = self.objective
        points = []
        for caps in dict.fromkeys(c for c, _ in ob.episodes):
            runs = {s: ob.episodes[(caps, s)]["goodput_rps"] for s in ob.seeds if (caps, s) in ob.episodes}
            entry: dict[str, Any] = {"caps": list(caps), "pruned": caps in ob.pruned}
            if ob.complete(caps):
                entry["goodput_rps"] = ob.mean(caps)
                entry["attainment"] = ob.mean(caps, "attainment")
                entry["worst_attainment"] = ob.mean(caps, "worst_attainment")
            entry["goodput_rps_per_seed"] = {str(s): v for s, v in runs.items()}
            inferred = [s for s in ob.seeds if "inferred_from" in ob.episodes.get((caps, s), {})]
            if inferred:
                entry["inferred_on_seeds"] = inferred  # filled in from an episode whose limit never bound
            points.append(entry)
        best = self.point(self.best)
        under = {}
        if ob.kind == "contract":
            figs = ob.contracts(self.best)
            given = {t.name: t.contract.model_dump(exclude_none=True) for t in sc.tenants if t.contract is not None}
            under = {"contracts": {n: {"contract": given[n], **f} for n, f in figs.items()},
                     "contracts_met": sum(int(f["contract_met"]) for f in figs.values()),
                     "contracts_total": len(figs)}
        return {
            "format": STORE_FORMAT,
            "scenario": sc.name,
            "source": self.source,
            "fingerprint": fingerprint(sc, ob.kind),
            "spec_fingerprint": spec_fingerprint(sc.control_spec()),
            "tenants": names,
            "caps": dict(zip(names, self.best, strict=True)),
            "policy": static_policy(self.best),
            "seeds": self.seeds,
            "objective": "mean goodput_rps over the seeds (offline.rollout of the static caps, ramp from initial)"
            if ob.kind == "goodput" else "the most mean goodput_rps over the seeds among the caps that keep every "
            "contract on the seeds pooled (each promise broken costs "
            f"{BROKEN_PENALTY:g} req/s, each in-contract request short of one {CONTRACT_PENALTY:g} req/s a seed)",
            "searched_for": ob.kind,
            **under,
            "goodput_rps": best["goodput_rps"],
            "attainment": best.get("attainment"),
            "worst_attainment": best.get("worst_attainment"),
            "best": best,
            "plain_static": self.point(self.start),
            "ramp": self.ramp,
            "command": command,
            "wall_s": round(self.wall_s, 1),
            "workers": self.workers,
            "search": {
                "method": "coordinate descent: the log grid, then the ×1.5 midpoints next to the best"
                if len(self.descents) > 1
                else "coordinate descent over the log grid",
                "grids": {n: g for n, g in zip(names, self.grids, strict=True)},
                "race_margin": ob.race_margin,
                "rollouts": ob.rollouts,
                "inferred": ob.inferred,
                "points": len(points),
                "stages": [{"stage": d.stage, "rounds": d.rounds, "converged": d.converged} for d in self.descents],
                "sweeps": [
                    {
                        "stage": w.stage,
                        "round": w.round,
                        "tenant": names[w.tenant],
                        "from": w.start[w.tenant],
                        "to": w.end[w.tenant],
                        "scores": {str(v): (s if math.isfinite(s) else None) for v, s in w.scores.items()},
                    }
                    for d in self.descents
                    for w in d.sweeps
                ],
            },
            "points": points,
        }


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v)


def describe_sweep(w: Sweep, names: Sequence[str]) -> str:
    """One line of the search log: which tenant, where it went, what the candidates scored."""
    cands = " ".join(f"{v}:{s:.3f}" if math.isfinite(s) else f"{v}:pruned" for v, s in w.scores.items())
    move = f"{w.start[w.tenant]} → {w.end[w.tenant]}" if w.moved else f"stays {w.start[w.tenant]}"
    return f"{w.stage} round {w.round} · {names[w.tenant]}: {move}  goodput {w.scores[w.end[w.tenant]]:.3f}  [{cands}]"


def search_static(
    scenario: str | Path | Scenario,
    seeds: Sequence[int] = SEARCH_SEEDS,
    workers: int = 1,
    *,
    refine: bool = True,
    race_margin: float = 0.02,
    window: int | None = 2,
    max_rounds: int = 10,
    rel_tol: float = 0.0,
    measure_ramp: bool = True,
    progress: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
    objective: SearchGoal = "goodput",
) -> SearchResult:
    """Search per-tenant static caps on ``seeds`` for the most mean goodput, or (``objective="contract"``) the
    most among those that keep every contract (the module's docstring: the grid, the descent, the tie-break,
    the racing). Starts at the scenario's ``initial`` caps (plain ``static``)."""
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    source = sc.name if isinstance(scenario, Scenario) else _source(scenario)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    seeds = [int(s) for s in seeds]
    lim = sc.control_spec().limits
    n = len(sc.tenants)
    names = [t.name for t in sc.tenants]
    grid = log_grid(lim)
    start: Caps = (lim.initial,) * n
    t0 = time.perf_counter()
    # the workers simulate the engines in effect here, a calibrated fit included, however they start
    pool = ProcessPoolExecutor(max_workers=workers, initializer=install, initargs=(overrides(),)) \
        if workers > 1 else None
    try:
        ob = SimObjective(sc, seeds, pool, workers, race_margin, progress, objective)
        say = (lambda w: log(describe_sweep(w, names))) if log is not None else None
        descents = [
            coordinate_descent(
                ob,
                start,
                log_sweep([grid] * n, window),
                max_rounds=max_rounds,
                rel_tol=rel_tol,
                stage="grid",
                on_sweep=say,
            )
        ]
        grids = [grid] * n
        if refine:
            fine = fine_grid(grid)
            if fine != grid:
                grids = [fine] * n
                descents.append(
                    coordinate_descent(
                        ob,
                        descents[0].best,
                        adjacent(grids),
                        max_rounds=max_rounds,
                        rel_tol=rel_tol,
                        stage="refine",
                        on_sweep=say,
                    )
                )
        best = descents[-1].best
        ramp = _ramp(sc, best, seeds, pool, ob) if measure_ramp else {}
    finally:
        if pool is not None:
            pool.shutdown()
    return SearchResult(sc, source, seeds, start, best, descents, ob, time.perf_counter() - t0, workers, grids, ramp)


def _ramp(sc: Scenario, caps: Caps, seeds: Sequence[int], pool: Executor | None, ob: SimObjective) -> dict[str, float]:
    lim = sc.limits
    steps = max(math.ceil(abs(c - lim.initial) / lim.max_step) for c in caps)
    out = {"decisions": float(steps), "seconds": steps * sc.interval_s, "goodput_rps_ramped": ob.mean(caps)}
    if steps == 0:
        out["goodput_rps_at_caps"] = out["goodput_rps_ramped"]
        return out
    args = [(sc, ob.key, caps, s) for s in seeds]
    vals = list(pool.map(_episode_at_caps, args) if pool is not None else map(_episode_at_caps, args))
    out["goodput_rps_at_caps"] = sum(vals) / len(vals)
    return out


def _source(scenario: str | Path) -> str:
    """How to load the scenario again: its bundled name, or the absolute path of its file."""
    p = Path(scenario)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return str(p.resolve())
    return str(scenario)

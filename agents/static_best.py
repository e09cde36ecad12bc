"""``static:best``: per-tenant static caps tuned for goodput, shipped and cached like a trained policy.

An operator who sets Kueue-style per-tenant quotas tunes them on last week's traffic and deploys them
unchanged. The caps are found by ``admit search-static`` (admit.train.static_search: the search, its simulator
objective and the store's format) and kept as JSON tuning stores; this module finds them and holds the
controller that deploys them, as agents/sb3_policy.py loads what ``admit train`` writes.

**static:best** (``make_controller("static:best")``; `BestStatic`) holds each tenant's limit at the caps
tuned for the scenario being evaluated, found by the scenario's fingerprint (`fingerprint`: a hash of its
parsed content, without the name, the description and the reward weights, which change nothing in an
episode) in a tuning store: the JSON files ``admit search-static`` writes. It looks in the shipped store
(agents/pretrained/static-best/*.json, beside the other shipped policies, tuned on `SEARCH_SEEDS`) and then in
the cache (`cache_dir`: ``$ADMIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/admit``, else ``~/.cache/admit``; its
static_best/ folder). Where neither holds caps for this fingerprint — a scenario of one's own, a family
instance, or a bundled scenario that changed since its caps were shipped (stale) — it says so on stderr,
tunes on `SEARCH_SEEDS` there and then and caches the result. The tuning seeds are 900000..900004: ``admit
evaluate``'s seeds 0..N-1, the training env's validation seeds (500000 + j) and its episode seeds
(1000000 + ...) never reach them, and `BestStatic.reset` refuses an evaluation seed its caps were tuned on.

A controller learns its scenario only through the ``ControlSpec`` at ``reset``, which has the tenants and
the bounds but not the workload. ``make_controller("static:best", scenario=S)`` binds it to ``S``; unbound
(as ``admit evaluate`` makes it today), it finds the one scenario with this control spec among the bundled
scenarios and the stores' own scenarios, and says so when there is none or more than one. Unbound, a
bundled scenario with an override the spec does not show (the horizon, say) gets the bundled scenario's caps.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from admit.controllers.static import StaticController
from admit.core.spec import ControlSpec
from admit.envs.scenario import Scenario, bundled_scenarios, load_scenario
from admit.train.static_search import (
    SEARCH_SEEDS,
    STORE_FORMAT,
    Caps,
    SearchGoal,
    fingerprint,
    format_seeds,
    search_static,
    static_policy,
    write_store,
)

# ---------------------------------------------------------------------------------------------- stores
# per objective: the policy that deploys its caps, its shipped folder under agents/pretrained/, its cache folder
POLICY: dict[SearchGoal, str] = {"goodput": "static:best", "contract": "static:contract"}
_SHIPPED: dict[SearchGoal, str] = {"goodput": "static-best", "contract": "static-contract"}
_CACHED: dict[SearchGoal, str] = {"goodput": "static_best", "contract": "static_contract"}


def shipped_dir(objective: SearchGoal = "goodput") -> Path:
    """agents/pretrained/static-best/ (static-contract/ under the contracts): the tunings that ship with admit
    (``admit search-static --out`` there)."""
    return Path(str(resources.files("admit.agents").joinpath("pretrained").joinpath(_SHIPPED[objective])))


def cache_dir(objective: SearchGoal = "goodput") -> Path:
    """Where tunings made on the fly (and ``admit search-static`` without ``--out``) go: ``$ADMIT_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/admit``, else ``~/.cache/admit``; the static_best/ (static_contract/) folder in it."""
    root = os.environ.get("ADMIT_CACHE_DIR") or (
        str(Path(os.environ["XDG_CACHE_HOME"]) / "admit") if os.environ.get("XDG_CACHE_HOME") else None
    )
    return (Path(root) if root else Path.home() / ".cache" / "admit") / _CACHED[objective]


def cache_path(scenario: Scenario, objective: SearchGoal = "goodput") -> Path:
    safe = re.sub(r"[^A-Za-z0-9._@-]+", "_", scenario.name) or "scenario"
    return cache_dir(objective) / f"{safe}-{fingerprint(scenario, objective)[:16]}.json"


@dataclass(frozen=True)
class TunedCaps:
    """One tuning store file, checked: the caps per tenant, the seeds they were tuned on, the fingerprint."""

    path: Path
    scenario: str
    source: str
    fingerprint: str
    spec_fingerprint: str
    tenants: tuple[str, ...]
    caps: Caps
    seeds: tuple[int, ...]
    goodput_rps: float

    @classmethod
    def load(cls, path: Path) -> TunedCaps:
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"tuning store {path}: cannot read it: {e}") from None
        try:
            if d.get("format") != STORE_FORMAT:
                raise ValueError(f"format {d.get('format')!r}, expected {STORE_FORMAT}")
            tenants = tuple(str(t) for t in d["tenants"])
            caps = tuple(int(d["caps"][t]) for t in tenants)
            seeds = tuple(int(s) for s in d["seeds"])
            return cls(
                Path(path),
                str(d["scenario"]),
                str(d.get("source", d["scenario"])),
                str(d["fingerprint"]),
                str(d["spec_fingerprint"]),
                tenants,
                caps,
                seeds,
                float(d["goodput_rps"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"tuning store {path} is malformed: {e!r}") from None


def _stores(folder: Path, log: Callable[[str], None]) -> list[TunedCaps]:
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob("*.json")):
        try:
            out.append(TunedCaps.load(p))
        except ValueError as e:
            log(f"static:best: ignoring {e}")
    return out


def all_stores(log: Callable[[str], None] | None = None, objective: SearchGoal = "goodput") -> list[TunedCaps]:
    """Every readable tuning of ``objective``, shipped first, then cached."""
    say = log or to_stderr
    return _stores(shipped_dir(objective), say) + _stores(cache_dir(objective), say)


def to_stderr(msg: str) -> None:
    """Where the tuned caps say what they do when the caller gives no log: stderr, at once."""
    print(msg, file=sys.stderr, flush=True)


_RESOLVED: dict[tuple[str, str, str], TunedCaps] = {}


def tuned_caps(
    scenario: Scenario, *, workers: int | None = None, log: Callable[[str], None] | None = None,
    objective: SearchGoal = "goodput",
) -> TunedCaps:
    """The stored tuning of ``scenario`` for ``objective`` (by fingerprint, shipped then cached); where none is,
    tune on `SEARCH_SEEDS` now, say so, and cache it. Remembered per process."""
    say = log or to_stderr
    fp = fingerprint(scenario, objective)
    policy = POLICY[objective]
    key = (fp, str(shipped_dir(objective)), str(cache_dir(objective)))
    if key in _RESOLVED:
        return _RESOLVED[key]
    stores = all_stores(say, objective)
    found = next((s for s in stores if s.fingerprint == fp), None)
    if found is not None and found.tenants != tuple(t.name for t in scenario.tenants):
        raise ValueError(
            f"tuning store {found.path} names tenants {list(found.tenants)}, the scenario has "
            f"{[t.name for t in scenario.tenants]}"
        )
    if found is None:
        old = [s for s in stores if s.scenario == scenario.name]
        why = (
            f"the caps in {old[0].path} were tuned on another version of {scenario.name!r} or another engine "
            f"(fingerprint {old[0].fingerprint[:12]}, this one {fp[:12]}): stale here"
            if old
            else f"no tuned caps for {scenario.name!r} (fingerprint {fp[:12]}) in {shipped_dir(objective)} or "
            f"{cache_dir(objective)}"
        )
        w = workers if workers is not None else int(os.environ.get("ADMIT_SEARCH_WORKERS", min(4, os.cpu_count() or 1)))
        path = cache_path(scenario, objective)
        say(f"{policy}: {why}; searching now on seeds {format_seeds(SEARCH_SEEDS)} with {w} worker(s), into {path}")
        result = search_static(scenario, SEARCH_SEEDS, w, objective=objective)
        blind = " --blind" if objective == "goodput" and scenario.has_contracts else ""
        cmd = (
            f"(on the fly, {policy}) admit search-static --scenario {result.source} --seeds "
            f"{format_seeds(SEARCH_SEEDS)} --workers {w}{blind}"
        )
        write_store(result.to_json(cmd), path)
        found = TunedCaps.load(path)
        say(
            f"{policy}: {scenario.name}: caps {static_policy(found.caps)[len('static:') :]} "
            f"(goodput {found.goodput_rps:.3f} req/s on the tuning seeds) after {result.wall_s:.0f} s"
        )
    _RESOLVED[key] = found
    return found


_BY_SPEC: dict[tuple[ControlSpec, str, str], Scenario] = {}


def scenario_for_spec(spec: ControlSpec, log: Callable[[str], None] | None = None) -> Scenario:
    """The one scenario whose control spec is ``spec``: among the bundled scenarios and the scenarios the
    stores were tuned on (reloaded from their source, so a changed file is seen as changed). Raises ValueError
    when there is none or more than one."""
    key = (spec, str(shipped_dir()), str(cache_dir()))
    if key in _BY_SPEC:
        return _BY_SPEC[key]
    say = log or to_stderr
    found: dict[str, Scenario] = {}
    for name in bundled_scenarios():
        sc = load_scenario(name)
        if sc.control_spec() == spec:
            found.setdefault(fingerprint(sc), sc)
    tenant_names = tuple(t.name for t in spec.tenants)
    for st in all_stores(say):
        # the tenants' names sift the stores (a store's spec fingerprint is of the ControlSpec of its day, and
        # the spec has gained fields since); the spec itself decides
        if st.tenants != tenant_names or st.source in bundled_scenarios():
            continue
        try:
            sc = load_scenario(st.source)
        except Exception as e:  # a source that is gone or no longer parses: that store cannot say anything
            say(f"static:best: ignoring {st.path}: its scenario {st.source!r} does not load: {e}")
            continue
        if sc.control_spec() == spec:
            found.setdefault(fingerprint(sc), sc)
    names = ", ".join(f"{s.name!r}" for s in found.values())
    tenants = ", ".join(t.name for t in spec.tenants)
    if not found:
        raise ValueError(
            f"static:best: no known scenario has this control spec (tenants {tenants}): it matches no bundled "
            f"scenario and no tuning in {shipped_dir()} or {cache_dir()}; search them first (admit search-static "
            "--scenario S) or make the policy with make_controller('static:best', scenario=S)"
        )
    if len(found) > 1:
        raise ValueError(
            f"static:best: several scenarios have this control spec (tenants {tenants}): {names}; make the "
            "policy with make_controller('static:best', scenario=S) to say which"
        )
    (sc,) = found.values()
    _BY_SPEC[key] = sc
    return sc


def check_seeds(policies: Sequence[str], seeds: Sequence[int], scenario: Scenario) -> None:
    """Raise ValueError when an evaluation of ``policies`` on ``seeds`` would test a tuned static policy
    (static:best, static:contract, static:contract-stale) on a seed its caps were tuned on: the seeds of the store
    it deploys on ``scenario``, for static:contract-stale its last-week sibling's (``admit evaluate`` can call it
    before any work; `BestStatic.reset` checks it anyway)."""
    for cls in TUNED:
        if cls.name in policies:
            _refuse_overlap(tuned_caps(cls().searched_on(scenario), objective=cls.objective), seeds, cls.name)


def _refuse_overlap(tuned: TunedCaps, seeds: Iterable[int], policy: str = "static:best") -> None:
    bad = sorted(set(int(s) for s in seeds) & set(tuned.seeds))
    if bad:
        raise ValueError(
            f"{policy}'s caps for {tuned.scenario!r} were tuned on seeds {format_seeds(tuned.seeds)} "
            f"({tuned.path}); evaluating it on seed {format_seeds(bad)} would test it on the data it was tuned "
            f"on: choose evaluation seeds outside {format_seeds(tuned.seeds)}"
        )


# ---------------------------------------------------------------------------------------------- static:best
class BestStatic(StaticController):
    """``static:best``: a static controller at the caps tuned for its scenario (the module's docstring).

    Its caps are resolved at ``reset`` (where the spec arrives); ``bind_scenario`` names the scenario first.
    ``reset(spec, seed)`` raises ValueError when ``seed`` is one of the tuning seeds.
    """

    name = "static:best"
    objective: SearchGoal = "goodput"

    def __init__(self, scenario: Scenario | None = None) -> None:
        super().__init__(None)
        self.scenario = scenario
        self.tuned: TunedCaps | None = None

    def bind_scenario(self, scenario: Scenario) -> None:
        """Name the scenario this controller will be evaluated on (the registry's ``make_controller(...,
        scenario=S)``): its caps are then found by its own fingerprint, not by its control spec."""
        self.scenario = scenario

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        sc = self.scenario
        if sc is None:
            sc = scenario_for_spec(spec)
        elif sc.control_spec() != spec:
            raise ValueError(f"{self.name} is bound to scenario {sc.name!r} but was reset with another control spec")
        tuned = tuned_caps(self.searched_on(sc), objective=self.objective)
        if seed is not None:
            _refuse_overlap(tuned, [seed], self.name)
        self.tuned = tuned
        self.cap = list(tuned.caps)
        super().reset(spec, seed)

    def searched_on(self, scenario: Scenario) -> Scenario:
        """The scenario whose caps it deploys on ``scenario``: that one itself."""
        return scenario


class ContractStatic(BestStatic):
    """``static:contract``: static caps searched for the most goodput among those that keep every contract on
    the tuning seeds (admit.train.static_search, ``objective="contract"``): what an operator who honours the
    contracts with fixed caps deploys. Stored and found as static:best's are, in static-contract/ folders."""

    name = "static:contract"
    objective: SearchGoal = "contract"


class StaleContractStatic(ContractStatic):
    """``static:contract-stale``: static:contract's caps tuned on the scenario's "last week" (envs/family.py
    `last_week`: the same tenants and contracts, each tenant's rates times a factor in ×0.5–×2, deterministic
    in the scenario's name) and deployed unchanged on this week's traffic: what an operator who sets quotas
    from last week's traffic gets. Stored and found by the sibling's fingerprint, in static-contract/ folders
    like static:contract's (the sibling is a scenario of its own, ``NAME~last-week``)."""

    name = "static:contract-stale"

    def searched_on(self, scenario: Scenario) -> Scenario:
        """Its last-week sibling (envs/family.py ``last_week``)."""
        from admit.envs.family import last_week  # families load only when asked for

        return last_week(scenario)


# every policy that deploys a tuning store, for `check_seeds`
TUNED: tuple[type[BestStatic], ...] = (BestStatic, ContractStatic, StaleContractStatic)

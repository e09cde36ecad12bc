"""Scenario families: one scenario per instance seed, sampled from building blocks, split into train /
validation / test seeds.

A fixed scenario is one world; a policy tuned on it may have learned that world. A family is a
distribution of worlds: ``envs/families/NAME.yaml`` lists building blocks (tenant templates), how many
tenants an instance has, how loaded its engine is, the SLO tiers and which blocks get which, and the fixed
part every instance shares (engine, horizon, interval, window, admission, limits, reward).
``sample_scenario(family, seed)`` draws instance ``FAMILY@SEED``; ``load_scenario("FAMILY@SEED")`` (and so
``admit evaluate --scenario``, ``admit train`` and ``gymnasium.make(..., scenario=...)``) resolves it.

An instance, drawn from its own stream (``[seed, 0xFA417, crc32(family name)]``, independent of the episode
seeds an instance is then run on):

1. the tenant count, uniform on ``tenants.min..max``; the ServeGen start (one 10-minute window boundary of
   the 14 days, shared by the instance's ServeGen tenants, so they see one time of day);
2. the blocks, one per tenant, with probability ∝ ``weight`` among those not used ``max_count`` times (a
   ServeGen block also runs out of clients it can draw at that start: see ``ServeGenBlock``);
3. the load ``L``, uniform on ``load.min..max``, and its split: shares ``Dirichlet(split.concentration)``
   lifted so each is at least ``split.min_share``;
4. per tenant, in block order: its SLO tier (``tiers``: probabilities), its ``vary`` knobs (log-uniform on
   their ranges), its ServeGen client (uniform among the unused active ones), then the arrival rates scaled so
   that the tenant's utilisation ``λ_i / capacity_i`` is ``L·share_i``.

Load is utilisation (:func:`scenario_load`): ``Σ λ_i / capacity_i``, where ``λ_i`` is the tenant's mean
arrival rate over the horizon (:func:`mean_rate`) and ``capacity_i`` the engine's estimated requests/s on
that tenant's request sizes alone (engine/capacity.py: closed form from the step-time model). 1.0 is the
engine full; the split's scaling is exact, so every instance's load is ``L``.

Seeds. An instance seed must lie in one of the family's three ranges (inclusive, disjoint): train on the
first, select on the second, report on the third. A seed outside all three is an error, not a fourth kind
of instance, so that "the test instances" is a fixed set. Instances depend on the family file and on this
code: editing either changes them.
"""

from __future__ import annotations

import copy
import itertools
import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from admit.core.config import error_lines
from admit.core.contract import ATTAINMENT_EPS
from admit.core.schema import StrictModel
from admit.core.slo import SLO
from admit.core.workload import MMPP, Constant, Diurnal, Gamma, LognormalSize, Poisson, Ramp
from admit.engine.capacity import Mix, mix_capacity_rps
from admit.engine.presets import get_preset
from admit.envs import servegen
from admit.envs.scenario import (
    EngineConfig,
    Scenario,
    ScenarioError,
    ScenarioTenant,
    SlotEngineConfig,
    TokenEngineConfig,
    parse_scenario,
)
from admit.envs.workload import ArrivalSpec, SizeSpec, Trace, load_trace
from pydantic import Field, TypeAdapter, ValidationError, model_validator
from scipy import special

FAMILY_STREAM = 0xFA417  # the instance stream's tag: instance draws never coincide with an episode's
LAST_WEEK_STREAM = 0x1A57  # the last-week sibling's stream (with the family tag and the scenario's name)
LAST_WEEK = "~last-week"  # the suffix naming an instance's last-week sibling: h200-drift@11000~last-week
LAST_WEEK_RANGE = (0.5, 2.0)  # each tenant's rate times a factor log-uniform on this range
SPLITS = ("train", "validation", "test")
SIZE_DRAWS = 16_384  # sizes standing for a size spec in the capacity estimate (see _marginal)

# the arrival fields the family sets from the load, by kind: they scale the mean rate linearly
RATE_FIELDS: dict[str, tuple[str, ...]] = {
    "poisson": ("rate",),
    "constant": ("rate",),
    "gamma": ("rate",),
    "diurnal": ("rate",),
    "ramp": ("rate", "rate_start"),
    "mmpp": ("rate_on", "rate_off"),
    "trace": ("speedup",),
    "servegen": ("rate_scale",),
}


_ENGINE: TypeAdapter[SlotEngineConfig | TokenEngineConfig] = TypeAdapter(EngineConfig)


class FamilyError(ScenarioError):
    """A family file or an instance name that cannot be used; the message says what and what is allowed."""


class SeedRange(StrictModel):
    first: int = Field(ge=0)
    last: int = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> SeedRange:
        if self.last < self.first:
            raise ValueError(f"a seed range needs first <= last, got {self.first}..{self.last}")
        return self

    def __contains__(self, seed: object) -> bool:
        return isinstance(seed, int) and self.first <= seed <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def seeds(self, n: int | None = None) -> list[int]:
        """The range's first ``n`` seeds (all of them without ``n``)."""
        last = self.last if n is None else min(self.last, self.first + n - 1)
        return list(range(self.first, last + 1))


class Seeds(StrictModel):
    train: SeedRange
    validation: SeedRange
    test: SeedRange

    @model_validator(mode="after")
    def _disjoint(self) -> Seeds:
        ranges = sorted((getattr(self, s).first, getattr(self, s).last, s) for s in SPLITS)
        for (_, last, a), (first, _, b) in itertools.pairwise(ranges):
            if first <= last:
                raise ValueError(f"seed ranges must be disjoint: {a} and {b} overlap")
        return self

    def split_of(self, seed: int) -> str | None:
        return next((s for s in SPLITS if seed in getattr(self, s)), None)

    def __str__(self) -> str:
        return ", ".join(f"{s} {getattr(self, s)}" for s in SPLITS)


class CountRange(StrictModel):
    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _order(self) -> CountRange:
        if self.max < self.min:
            raise ValueError(f"tenants needs min <= max, got {self.min}, {self.max}")
        return self


class LoadRange(StrictModel):
    min: float = Field(gt=0)
    max: float = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> LoadRange:
        if self.max < self.min:
            raise ValueError(f"load needs min <= max, got {self.min}, {self.max}")
        return self


class Split(StrictModel):
    """How an instance's load is split between its tenants: Dirichlet shares, each at least ``min_share``."""

    concentration: float = Field(default=1.0, gt=0)
    min_share: float = Field(default=0.0, ge=0, lt=1)


class ServeGenBlock(StrictModel):
    """ServeGen clients to draw from: arrivals from the client's table, lognormal sizes fitted to its
    published p50/p99 lengths at the instance's start (envs/servegen.py), prompts capped at ``max_tokens``,
    outputs at half that. A client is drawn only where it is active (arrivals in the horizon) and where the
    engine's capacity on its requests is at most ``max_capacity_rps``: some clients' requests shrink to a few
    tokens at some hours, and such a client at a share of the load would be thousands of requests per second
    to simulate."""

    clients: list[int] = Field(min_length=1)
    max_tokens: int = Field(default=8192, ge=2)
    max_capacity_rps: float = Field(default=100.0, gt=0)

    @model_validator(mode="after")
    def _known(self) -> ServeGenBlock:
        lengths = servegen._lengths()
        bad = [c for c in self.clients if c not in lengths]
        if bad:
            raise ValueError(f"ServeGen clients {bad} have no published length summary (envs/data/servegen_m_large)")
        if len(set(self.clients)) != len(self.clients):
            raise ValueError(f"ServeGen clients must be distinct, got {self.clients}")
        return self


class Block(StrictModel):
    """A tenant template: ``tenant`` (a scenario tenant without name and slo, rates at any scale) or
    ``servegen`` (clients of the ServeGen table)."""

    weight: float = Field(default=1.0, gt=0)
    max_count: int | None = Field(default=None, ge=1)
    tiers: dict[str, float] = Field(min_length=1)
    tenant: dict[str, Any] | None = None
    servegen: ServeGenBlock | None = None
    vary: dict[str, tuple[float, float]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _shape(self) -> Block:
        if (self.tenant is None) == (self.servegen is None):
            raise ValueError("a block has exactly one of 'tenant' (a template) and 'servegen' (clients)")
        if any(p <= 0 for p in self.tiers.values()):
            raise ValueError(f"tier probabilities must be > 0, got {self.tiers}")
        if self.servegen is not None and self.vary:
            raise ValueError("a servegen block takes its sizes from the table: it has no 'vary'")
        for path, (lo, hi) in self.vary.items():
            if not 0 < lo <= hi:
                raise ValueError(f"vary {path}: the range needs 0 < low <= high, got [{lo}, {hi}]")
        return self


class ContractDraw(StrictModel):
    """How a tenant's contract is drawn from its own drawn traffic: ``requests_per_s`` a fraction of the
    tenant's mean rate (uniform on ``rate``), the burst that many seconds of the contracted rate (uniform on
    ``burst_s``, at least one request), the attainment as given."""

    rate: tuple[float, float]
    burst_s: tuple[float, float]
    attainment: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _ranges(self) -> ContractDraw:
        for key in ("rate", "burst_s"):
            lo, hi = getattr(self, key)
            if not 0 < lo <= hi:
                raise ValueError(f"contracts {key}: the range needs 0 < low <= high, got [{lo}, {hi}]")
        return self


class ContractsPart(StrictModel):
    """A family's contracts: per SLO tier (``tiers``) or for every tenant (``all``; a tier's entry wins), then
    all of an instance's contracts scaled down together where their loads exceed ``max_load``, then, where
    the scenario's initial caps do not keep every contract at contract (envs/contracts.py
    `attainment_at_contract`, on ``check_seeds`` episodes), every rate times ``scale_step`` until they do (at
    most ``max_scalings`` times), then a promise still broken lowered to what it gets (`_contracted`): the loads
    bound throughput, but one tenant's long prompts can delay another's first tokens past a promise the
    engine's capacity allows."""

    max_load: float = Field(default=0.8, gt=0, le=1)
    all: ContractDraw | None = None
    tiers: dict[str, ContractDraw] = Field(default_factory=dict)
    check_seeds: int = Field(default=2, ge=0, le=10, description="episodes of the feasibility check (0: none)")
    scale_step: float = Field(default=0.8, gt=0, lt=1)
    max_scalings: int = Field(default=4, ge=0, le=100)

    def draw_for(self, tier: str) -> ContractDraw | None:
        return self.tiers.get(tier, self.all)


class FixedPart(StrictModel):
    """What every instance shares: a scenario without name, description and tenants."""

    horizon_s: float = Field(gt=0)
    interval_s: float = Field(gt=0)
    window_s: float = Field(gt=0)
    engine: dict[str, Any]
    admission: dict[str, Any] = Field(default_factory=dict)
    limits: dict[str, Any] = Field(default_factory=dict)
    reward: dict[str, Any] = Field(default_factory=dict)


class Family(StrictModel):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    seeds: Seeds
    tenants: CountRange
    load: LoadRange
    split: Split = Split()
    slo_tiers: dict[str, SLO] = Field(min_length=1)
    scenario: FixedPart
    blocks: dict[str, Block] = Field(min_length=1)
    contracts: ContractsPart | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Family:
        if self.contracts is not None:
            unknown = sorted(set(self.contracts.tiers) - set(self.slo_tiers))
            if unknown:
                raise ValueError(f"contracts: unknown tiers {unknown}; slo_tiers are {sorted(self.slo_tiers)}")
        for name, b in self.blocks.items():
            unknown = sorted(set(b.tiers) - set(self.slo_tiers))
            if unknown:
                raise ValueError(f"block {name!r}: unknown tiers {unknown}; slo_tiers are {sorted(self.slo_tiers)}")
            if name.startswith("client-"):
                raise ValueError(f"block {name!r}: 'client-' names are ServeGen tenants'; pick another block name")
        room = [b.max_count if b.servegen is None else min(b.max_count or 10**9, len(b.servegen.clients))
                for b in self.blocks.values()]
        if all(r is not None for r in room) and sum(r for r in room if r is not None) < self.tenants.max:
            raise ValueError(f"the blocks allow at most {sum(r for r in room if r is not None)} tenants, fewer than "
                             f"tenants.max = {self.tenants.max}")
        if self.tenants.max * self.split.min_share >= 1:
            raise ValueError(f"split.min_share {self.split.min_share} leaves nothing to split among "
                             f"{self.tenants.max} tenants: it must be < 1 / tenants.max")
        return self

    def instance_name(self, seed: int) -> str:
        return f"{self.name}@{seed}"


# --------------------------------------------------------------------------- families on disk
def bundled_families() -> list[str]:
    folder = resources.files("admit.envs").joinpath("families")
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def parse_family(data: object, origin: str = "<dict>") -> Family:
    if not isinstance(data, dict):
        raise FamilyError(f"family {origin}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        fam = Family.model_validate(data)
    except ValidationError as e:
        raise FamilyError(f"family {origin} is invalid:\n" + "\n".join(f"  {x}" for x in error_lines(e))) from None
    _check_templates(fam, origin)
    return fam


@lru_cache(maxsize=32)
def _load_family_text(text: str, origin: str) -> Family:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FamilyError(f"family {origin}: not valid YAML: {e}") from None
    return parse_family(data, origin)


def load_family(name_or_path: str | Path) -> Family:
    """A bundled family by name (envs/families/NAME.yaml) or a family file by path."""
    origin = str(name_or_path)
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return _load_family_text(path.read_text(), origin)
    if origin not in _bundled_names():
        names = bundled_families()
        raise FamilyError(f"unknown family {origin!r}; bundled families: {', '.join(names) or 'none'} "
                          "(or a path to a family .yaml file)")
    return _bundled_family(origin)


@lru_cache(maxsize=1)
def _bundled_names() -> frozenset[str]:
    return frozenset(bundled_families())


@lru_cache(maxsize=32)
def _bundled_family(origin: str) -> Family:
    """A bundled family, read and checked once per process (a training env picks an instance at every reset)."""
    fam = _load_family_text(resources.files("admit.envs").joinpath("families", f"{origin}.yaml").read_text(), origin)
    if fam.name != origin:
        raise FamilyError(f"family file {origin}.yaml is named {fam.name!r}; a bundled family's name is its file's")
    return fam


def parse_instance_name(name: str) -> tuple[Family, int]:
    """``FAMILY@SEED`` (FAMILY a bundled name or a family file's path) → the family and the seed, or a clear
    error: unknown family, a seed that is not an integer, a seed in none of the family's ranges."""
    fam_name, at, seed_text = name.rpartition("@")
    if not at or not fam_name:
        raise FamilyError(f"{name!r} is not a family instance: write FAMILY@SEED, e.g. h200-mix@0")
    if not seed_text.isdigit():
        raise FamilyError(f"instance {name!r}: the seed after '@' must be a non-negative integer, got {seed_text!r}")
    fam = load_family(fam_name)
    seed = int(seed_text)
    if fam.seeds.split_of(seed) is None:
        raise FamilyError(f"instance {name!r}: seed {seed} is in none of {fam.name}'s seed ranges ({fam.seeds})")
    return fam, seed


def instance_data(name: str) -> dict[str, Any]:
    """The scenario mapping of instance ``FAMILY@SEED`` (what ``load_scenario`` parses, overrides applied), or
    of its last-week sibling ``FAMILY@SEED~last-week`` (`last_week`)."""
    if name.endswith(LAST_WEEK):
        return last_week_data(instance_data(name[: -len(LAST_WEEK)]))
    fam, seed = parse_instance_name(name)
    return sample_scenario_data(fam, seed)


def last_week_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario mapping ``data``'s "last week": the same tenants (sizes, SLOs, contracts, everything but
    the rates) with each tenant's arrival rates times a factor log-uniform on ``LAST_WEEK_RANGE``, drawn in
    tenant order from a stream of the scenario's name (for an instance, its family and seed), so it is
    deterministic. Named ``NAME~last-week``. What an operator tunes static caps on before deploying them
    on this week's traffic (agents/static_best.py, ``static:contract-stale``)."""
    name = str(data["name"])
    rng = np.random.default_rng([FAMILY_STREAM, LAST_WEEK_STREAM, zlib.crc32(name.encode())])
    lo, hi = (math.log(x) for x in LAST_WEEK_RANGE)
    tenants = []
    notes = []
    for t in data["tenants"]:
        arrival = dict(t["arrival"])
        kind = str(arrival.get("kind"))
        if kind not in RATE_FIELDS:
            raise FamilyError(f"scenario {name}: tenant {t['name']!r}'s arrival {kind!r} has no rate to redraw")
        factor = _sig(math.exp(rng.uniform(lo, hi)))
        tenants.append({**t, "arrival": _scaled(arrival, factor)})
        notes.append(f"{t['name']} x{factor:.2f}")
    desc = (f"Last week's traffic of {name} (envs/family.py last_week): its tenants with each rate redrawn, "
            f"{', '.join(notes)}.")
    return {**data, "name": name + LAST_WEEK, "description": desc, "tenants": tenants}


def last_week(scenario: Scenario | str) -> Scenario:
    """The last-week sibling of a scenario or of a scenario name (bundled, a path, ``FAMILY@SEED``): see
    `last_week_data`. A scenario's own overrides (a shorter horizon, say) are kept."""
    from admit.envs.scenario import load_scenario

    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    data = sc.model_dump(mode="json", exclude_unset=True)
    return parse_scenario(last_week_data(data), sc.name + LAST_WEEK)


# --------------------------------------------------------------------------- mean rates and capacity
def mean_rate(arrival: ArrivalSpec, horizon_s: float) -> float:
    """A tenant's mean arrival rate over ``[0, horizon_s)``, requests/s: exact for the memoryless processes,
    the expectation over the random rotation for a rotated trace, the table's windows for ServeGen."""
    if isinstance(arrival, Poisson | Constant | Gamma):
        return arrival.rate
    if isinstance(arrival, Ramp):
        return (arrival.rate_start + arrival.rate) / 2.0
    if isinstance(arrival, MMPP):
        return arrival.mean_rate
    if isinstance(arrival, Diurnal):
        w = 2.0 * math.pi / arrival.period_s
        swing = (math.cos(arrival.phase) - math.cos(w * horizon_s + arrival.phase)) / (w * horizon_s)
        return arrival.rate * (1.0 + arrival.amplitude * swing)
    if isinstance(arrival, Trace):
        return _trace_rate(arrival, horizon_s)
    if isinstance(arrival, servegen.ServeGenArrivals):
        return _servegen_rate(arrival.client_id, arrival.start_s, horizon_s) * arrival.rate_scale
    raise TypeError(f"no mean rate for arrival {arrival!r}")


def _trace_rate(tr: Trace, horizon_s: float) -> float:
    t, _, _ = load_trace(tr.source)
    if tr.random_shift_max_s <= 0:
        return len(tr.rows(horizon_s)[0]) / horizon_s
    span = (t[-1] + (t[-1] - t[0]) / max(len(t) - 1, 1)) / tr.speedup  # the rotation's period, as Trace.rows
    active = max(horizon_s - tr.offset_s, 0.0)
    covered = active if tr.loop else min(active, span)
    return len(t) * covered / span / horizon_s


@lru_cache(maxsize=256)
def _servegen_windows(client: int) -> tuple[np.ndarray, np.ndarray]:
    """A client's window starts and rates, the windows that produce no arrival (as ServeGenArrivals.times
    skips them) at rate 0."""
    rows = servegen._windows().get(client, [])
    starts = np.array([r[0] for r in rows], dtype=np.float64)
    rates = np.array([r[1] if r[1] > 0 and r[2] in ("Gamma", "Weibull") and r[3] > 0 else 0.0 for r in rows])
    return starts, rates


def _servegen_rate(client: int, start_s: float, horizon_s: float) -> float:
    """The client's mean rate over ``[start_s, start_s + horizon_s)``, its windows weighted by their overlap."""
    starts, rates = _servegen_windows(client)
    overlap = np.minimum(starts + servegen.WINDOW_S, start_s + horizon_s) - np.maximum(starts, start_s)
    return float(np.sum(rates * np.clip(overlap, 0.0, None)) / horizon_s)


@lru_cache(maxsize=1)
def _normal_quantiles() -> np.ndarray:
    return special.ndtri((np.arange(SIZE_DRAWS) + 0.5) / SIZE_DRAWS)


def _marginal(spec: SizeSpec, stream: int) -> np.ndarray:
    """Sizes standing for a spec's distribution: a lognormal's quantiles at the midpoints of ``SIZE_DRAWS``
    equal slices (stratified: its heavy tail's moments come out exact to a fraction of a percent), any other
    spec's ``SIZE_DRAWS`` draws from a fixed stream. Deterministic either way."""
    if isinstance(spec, LognormalSize):
        z = _normal_quantiles()
        return np.clip(np.rint(spec.median * np.exp(spec.sigma * z)), spec.min, spec.max)
    return spec.sample(np.random.default_rng([FAMILY_STREAM, stream]), SIZE_DRAWS)


@lru_cache(maxsize=1024)
def _spec_mix(prompt: SizeSpec, output: SizeSpec) -> Mix:
    return Mix.of_independent(_marginal(prompt, 1), _marginal(output, 2))


@lru_cache(maxsize=16)
def _trace_mix(source: str) -> Mix:
    _, prompt, output = load_trace(source)
    return Mix.of_pairs(prompt, output)


def tenant_mix(tenant: ScenarioTenant) -> Mix:
    """The tenant's request sizes as the capacity estimate sees them (engine/capacity.py's ``Mix``): a trace
    tenant without size specs by its rows (prompt and output as they went together), else its two specs as
    independent distributions (a spec beside a trace column: that column's rows as a sample)."""
    prompt: SizeSpec | np.ndarray | None = None
    output: SizeSpec | np.ndarray | None = None
    if isinstance(tenant.arrival, Trace):
        if tenant.prompt_tokens is None and tenant.output_tokens is None:
            return _trace_mix(tenant.arrival.source)
        _, prompt, output = load_trace(tenant.arrival.source)
    prompt = tenant.prompt_tokens if tenant.prompt_tokens is not None else prompt
    output = tenant.output_tokens if tenant.output_tokens is not None else output
    if prompt is None or output is None:
        raise ValueError(f"tenant {tenant.name!r} has no request sizes")
    if not isinstance(prompt, np.ndarray) and not isinstance(output, np.ndarray):
        return _spec_mix(prompt, output)
    p = prompt if isinstance(prompt, np.ndarray) else _marginal(prompt, 1)
    o = output if isinstance(output, np.ndarray) else _marginal(output, 2)
    return Mix.of_independent(p, o)


def tenant_sizes(tenant: ScenarioTenant, n: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (prompt, output) pairs like the tenant's requests, from a fixed stream: trace rows drawn with
    replacement, size specs drawn. What the closed-loop check of the estimate replays
    (engine/capacity.py's ``measure_capacity``)."""
    rng = np.random.default_rng([FAMILY_STREAM, 3])
    prompt = output = None
    if isinstance(tenant.arrival, Trace):
        _, p, o = load_trace(tenant.arrival.source)
        pick = rng.integers(0, len(p), n)
        prompt, output = p[pick], o[pick]
    if tenant.prompt_tokens is not None:
        prompt = tenant.prompt_tokens.sample(rng, n)
    if tenant.output_tokens is not None:
        output = tenant.output_tokens.sample(rng, n)
    if prompt is None or output is None:
        raise ValueError(f"tenant {tenant.name!r} has no request sizes")
    return prompt, output


def engine_capacity_rps(engine: SlotEngineConfig | TokenEngineConfig, tenant: ScenarioTenant) -> float:
    """The engine's estimated requests/s on ``tenant``'s requests alone (engine/capacity.py, with the
    scenario's own token budget and sequence cap); for a slot engine, slots / mean service time (request
    sizes do not matter to it)."""
    if isinstance(engine, SlotEngineConfig):
        return engine.slots / engine.mean_service_s
    return mix_capacity_rps(engine.preset, tenant_mix(tenant), engine.max_num_batched_tokens, engine.max_num_seqs)


def tenant_capacity_rps(scenario: Scenario, i: int) -> float:
    """``engine_capacity_rps`` of the scenario's engine and its tenant ``i``."""
    return engine_capacity_rps(scenario.engine, scenario.tenants[i])


def tenant_loads(scenario: Scenario) -> list[float]:
    """Each tenant's utilisation of the engine, ``mean_rate / capacity`` (see the module docstring)."""
    return [float(mean_rate(t.arrival, scenario.horizon_s) / tenant_capacity_rps(scenario, i))
            for i, t in enumerate(scenario.tenants)]


def contract_loads(scenario: Scenario) -> list[float | None]:
    """Each tenant's contract as a utilisation of the engine, like ``tenant_loads`` (None: no contract): its
    contracted requests/s (a token contract at the tenant's mean request size) over its capacity."""
    out: list[float | None] = []
    for i, t in enumerate(scenario.tenants):
        if t.contract is None:
            out.append(None)
            continue
        rps = t.contract.requests_per_s_at(tenant_mix(t).tokens) if t.contract.unit == "tokens" else t.contract.rate
        out.append(float(rps / tenant_capacity_rps(scenario, i)))
    return out


def scenario_load(scenario: Scenario) -> float:
    """The scenario's load: its tenants' utilisations summed, 1.0 = the engine's estimated capacity."""
    return float(sum(tenant_loads(scenario)))


# --------------------------------------------------------------------------- templates
def _leaves(path: str, tree: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    *parents, leaf = path.split(".")
    node: Any = tree
    for p in parents:
        node = node.get(p) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            raise KeyError(path)
    if leaf not in node:
        raise KeyError(path)
    return node, leaf


def _set(tree: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``tree`` with the dotted ``path`` set to ``value`` (the mappings on the way copied)."""
    *parents, leaf = path.split(".")
    out = dict(tree)
    node = out
    for p in parents:
        node[p] = dict(node[p])
        node = node[p]
    node[leaf] = value
    return out


def _template_tenant(name: str, template: Mapping[str, Any], slo: SLO) -> ScenarioTenant:
    return ScenarioTenant.model_validate({**template, "name": name, "slo": slo.given()})


def _check_templates(fam: Family, origin: str) -> None:
    """Every block's template must be a valid tenant at both ends of every ``vary`` range, with an arrival
    the family can scale; a ``vary`` path must name a number that is not one of the scaled rates."""
    slo = next(iter(fam.slo_tiers.values()))
    try:
        parse_scenario({**fam.scenario.model_dump(), "name": "x", "tenants": [
            {"name": "x", "arrival": {"kind": "poisson", "rate": 1.0},
             "prompt_tokens": {"kind": "constant", "value": 1}, "output_tokens": {"kind": "constant", "value": 1}}]})
    except ScenarioError as e:
        raise FamilyError(f"family {origin}: its scenario part is invalid: {e}") from None
    engine = _ENGINE.validate_python(fam.scenario.engine)
    if isinstance(engine, TokenEngineConfig):
        try:
            get_preset(engine.preset)  # the capacity estimate needs it; the schema alone does not check it
        except ValueError as e:
            raise FamilyError(f"family {origin}: scenario.engine: {e}") from None
    for bname, b in fam.blocks.items():
        where = f"family {origin}, block {bname!r}"
        if b.tenant is None:
            continue
        for key in ("name", "slo"):
            if key in b.tenant:
                raise FamilyError(f"{where}: a template has no {key!r}; the family sets it")
        kind = b.tenant.get("arrival", {}).get("kind") if isinstance(b.tenant.get("arrival"), Mapping) else None
        if kind not in RATE_FIELDS:
            raise FamilyError(f"{where}: arrival.kind {kind!r} cannot be scaled; allowed: {sorted(RATE_FIELDS)}")
        arrival = b.tenant["arrival"]
        if kind == "trace" and not (arrival.get("loop") and arrival.get("random_shift_max_s", 0) > 0):
            # looped, any speed fills the horizon; rotated, the mean rate is exactly linear in the speed-up
            raise FamilyError(f"{where}: a trace template needs loop: true and random_shift_max_s > 0")
        ends: list[dict[str, Any]] = [dict(b.tenant)]
        for path, (lo, hi) in b.vary.items():
            try:
                node, leaf = _leaves(path, b.tenant)
            except KeyError:
                raise FamilyError(f"{where}: vary {path!r} names no key of the template") from None
            value = node[leaf]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise FamilyError(f"{where}: vary {path!r} must name a number, it is {value!r}")
            if path.startswith("arrival.") and leaf in RATE_FIELDS[kind]:
                raise FamilyError(f"{where}: vary {path!r} is a rate the family sets from the load; vary the "
                                  "other arrival parameters")
            ends = [_set(t, path, _round_like(value, x)) for t in ends for x in (lo, hi)]
        for t in ends:
            try:
                _template_tenant(bname, t, slo)
            except ValidationError as e:
                lines = "\n".join(f"  {x}" for x in error_lines(e))
                raise FamilyError(f"{where}: the template is not a valid tenant:\n{lines}") from None


def _round_like(template_value: int | float, x: float) -> int | float:
    return round(x) if isinstance(template_value, int) else x


def _sig(x: float) -> float:
    """``x`` to 6 significant digits: what an instance's file shows; the load moves by < 1e-5."""
    return float(f"{x:.6g}")


def _scaled(arrival: Mapping[str, Any], factor: float) -> dict[str, Any]:
    out = dict(arrival)
    for f in RATE_FIELDS[str(arrival["kind"])]:
        out[f] = _sig(float(out.get(f, 1.0 if f in ("speedup", "rate_scale") else 0.0)) * factor)
    return out


# --------------------------------------------------------------------------- sampling
def instance_rng(fam: Family, seed: int) -> np.random.Generator:
    """The instance's own stream: independent of every episode stream (those are spawned from the seed alone)."""
    return np.random.default_rng([int(seed), FAMILY_STREAM, zlib.crc32(fam.name.encode())])


@lru_cache(maxsize=1)
def _servegen_span_s() -> float:
    """How far the ServeGen table reaches (14 days): where the last window of any client ends."""
    return max(rows[-1][0] for rows in servegen._windows().values()) + servegen.WINDOW_S


def _servegen_tenant(client: int, start_s: float, block: ServeGenBlock) -> dict[str, Any]:
    return servegen.servegen_tenant_configs([client], start_s, 1.0, block.max_tokens)[0]


def _active_clients(
    block: ServeGenBlock, start_s: float, horizon_s: float, engine: SlotEngineConfig | TokenEngineConfig
) -> list[int]:
    """The block's clients with arrivals in the horizon and capacity <= max_capacity_rps at ``start_s``."""
    out = []
    for c in block.clients:
        if _servegen_rate(c, start_s, horizon_s) <= 0:
            continue
        tenant = ScenarioTenant.model_validate(_servegen_tenant(c, start_s, block))
        if engine_capacity_rps(engine, tenant) <= block.max_capacity_rps:
            out.append(c)
    return out


def _pick_blocks(fam: Family, rng: np.random.Generator, n: int, room: dict[str, int | None]) -> list[str]:
    names = list(fam.blocks)
    used = dict.fromkeys(names, 0)
    out = []
    for _ in range(n):
        open_ = [b for b in names if room[b] is None or used[b] < (room[b] or 0)]
        if not open_:
            raise FamilyError(f"family {fam.name}: the blocks ran out before {n} tenants")
        w = np.array([fam.blocks[b].weight for b in open_])
        b = open_[int(rng.choice(len(open_), p=w / w.sum()))]
        used[b] += 1
        out.append(b)
    return out


def sample_scenario_data(fam: Family, seed: int) -> dict[str, Any]:
    """Instance ``seed`` of ``fam`` as a scenario mapping (the module docstring's draws, in that order)."""
    split = fam.seeds.split_of(seed)
    if split is None:
        raise FamilyError(f"family {fam.name}: seed {seed} is in none of its seed ranges ({fam.seeds})")
    rng = instance_rng(fam, seed)
    fixed = fam.scenario.model_dump()
    horizon = fam.scenario.horizon_s
    n = int(rng.integers(fam.tenants.min, fam.tenants.max + 1))
    last_start = max(int((_servegen_span_s() - horizon) // servegen.WINDOW_S), 0)
    start_s = float(rng.integers(0, last_start + 1)) * servegen.WINDOW_S
    engine = _ENGINE.validate_python(fixed["engine"])
    active = {b: _active_clients(blk.servegen, start_s, horizon, engine) for b, blk in fam.blocks.items()
              if blk.servegen is not None}
    room: dict[str, int | None] = {
        b: (blk.max_count if blk.servegen is None else min(blk.max_count or 10**9, len(active[b])))
        for b, blk in fam.blocks.items()
    }
    blocks = _pick_blocks(fam, rng, n, room)
    load = float(rng.uniform(fam.load.min, fam.load.max))
    raw = rng.dirichlet(np.full(n, fam.split.concentration))
    shares = (1.0 - n * fam.split.min_share) * raw + fam.split.min_share

    tenants: list[dict[str, Any]] = []
    notes: list[str] = []
    seen: dict[str, int] = {}
    drawn: list[tuple[str, float, float]] = []  # per tenant: its tier, mean rate and capacity, for the contracts
    for bname, share in zip(blocks, shares, strict=True):
        blk = fam.blocks[bname]
        tier_names = list(blk.tiers)
        p = np.array([blk.tiers[t] for t in tier_names])
        tier = tier_names[int(rng.choice(len(tier_names), p=p / p.sum()))]
        if blk.servegen is not None:
            pool = active[bname]
            client = pool.pop(int(rng.integers(0, len(pool))))
            t = _servegen_tenant(client, start_s, blk.servegen)
            name = t.pop("name")
        else:
            assert blk.tenant is not None
            t = dict(blk.tenant)
            for path, (lo, hi) in blk.vary.items():
                node, leaf = _leaves(path, t)
                t = _set(t, path, _round_like(node[leaf], _sig(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
            seen[bname] = seen.get(bname, 0) + 1
            name = bname if seen[bname] == 1 else f"{bname}-{seen[bname]}"
        unit = _template_tenant(name, t, fam.slo_tiers[tier])
        rate1 = mean_rate(unit.arrival, horizon)
        if rate1 <= 0:
            raise FamilyError(f"instance {fam.instance_name(seed)}: block {bname!r} has no arrivals in the horizon")
        cap = engine_capacity_rps(engine, unit)
        target = load * float(share)
        t["arrival"] = _scaled(unit.arrival.model_dump(), target * cap / rate1)
        tenants.append({"name": name, **t, "slo": fam.slo_tiers[tier].given()})
        notes.append(f"{name} ({bname}, {tier}, {target:.2f})")
        drawn.append((tier, target * cap, cap))
    desc = (f"Instance {seed} of the {fam.name} family ({split} seeds {getattr(fam.seeds, split)}), sampled by "
            f"envs/family.py: {n} tenants at {load:.3f}x the engine's estimated capacity (engine/capacity.py), "
            f"as tenant (block, SLO tier, utilisation): {', '.join(notes)}."
            + (f" Its ServeGen tenants start at {_clock(start_s)} of the table's 14 days."
               if any(fam.blocks[b].servegen is not None for b in blocks) else ""))
    data = {**fixed, "name": fam.instance_name(seed), "description": desc, "tenants": tenants}
    if fam.contracts is not None:
        data = _contracted(fam, seed, data, rng, drawn)
    return data


Pick = Callable[[ContractDraw], tuple[float, float]]  # a tenant's (rate fraction, burst seconds)


def _contracted(fam: Family, seed: int, data: dict[str, Any], rng: np.random.Generator,
                drawn: list[tuple[str, float, float]]) -> dict[str, Any]:
    """``data`` with its tenants' contracts: each tenant whose tier has a draw gets its rate fraction, then its
    burst seconds, in tenant order after every other draw (`_give_contracts`); then made feasible at contract
    (`ContractsPart`), on ``check_seeds`` episodes from ``seed`` with every tenant sending exactly its contract
    at the scenario's initial caps: every rate times ``scale_step`` while a promise breaks, at most
    ``max_scalings`` times; a promise still broken then is lowered to what the tenant's in-contract requests
    get (the multiple of 0.05 below; withdrawn under 0.5): a long-context tenant's longest prompts can miss a
    TTFT objective however little the others send. The draws are made once, so every scaling keeps them."""
    from admit.envs.contracts import attainment_at_contract  # the simulated world: only for contracts

    part = fam.contracts
    assert part is not None
    picks: list[tuple[float, float]] = []

    def pick(d: ContractDraw) -> tuple[float, float]:
        picks.append((float(rng.uniform(*d.rate)), float(rng.uniform(*d.burst_s))))
        return picks[-1]

    def broken(tenants: list[dict[str, Any]]) -> dict[str, float]:
        """The contracted tenants whose promise breaks in a check episode, with their lowest attainment."""
        sc = parse_scenario({**data, "tenants": tenants}, fam.instance_name(seed))
        runs = [attainment_at_contract(sc, seed + j) for j in range(part.check_seeds)]
        promised = {t["name"]: t["contract"]["attainment"] for t in tenants if "contract" in t}
        low = {name: min(r[name] for r in runs) for name in promised}
        return {name: a for name, a in low.items() if a + ATTAINMENT_EPS < promised[name]}

    then = 1.0
    for k in range(part.max_scalings + 1):
        tenants = copy.deepcopy(data["tenants"])
        replay = iter(list(picks))

        def again(d: ContractDraw, it: Iterator[tuple[float, float]] = replay) -> tuple[float, float]:
            return next(it)

        note = _give_contracts(part, pick if k == 0 else again, tenants, drawn, "drawn from", then=then)
        if part.check_seeds == 0 or not note:
            return {**data, "tenants": tenants, "description": data["description"] + note}
        miss = broken(tenants)
        if not miss or k == part.max_scalings:
            break
        then *= part.scale_step
    extra = []
    if then < 1.0:
        extra.append("the rates scaled so that the initial caps keep the promises when each tenant sends exactly "
                     "its contract")
    for t in tenants:
        if t["name"] in miss:
            lower = math.floor(miss[t["name"]] * 20 + ATTAINMENT_EPS) / 20
            if lower >= 0.5:
                t["contract"]["attainment"] = lower
            else:
                t.pop("contract")
            extra.append(f"{t['name']}'s promise {f'lowered to {lower:g}' if lower >= 0.5 else 'withdrawn'}, what "
                         "its in-contract requests get then")
    if extra:
        note = note.rstrip(".") + f"; {'; '.join(extra)} (envs/family.py, {part.check_seeds} episodes)."
    return {**data, "tenants": tenants, "description": data["description"] + note}


def _give_contracts(
    part: ContractsPart, pick: Pick, tenants: list[dict[str, Any]], drawn: list[tuple[str, float, float]],
    how: str, then: float = 1.0,
) -> str:
    """Give ``tenants`` (in place) the contracts of ``part``, with each tenant's rate fraction and burst
    seconds from ``pick`` (in tenant order); then, where the contracts' loads (rate over the tenant's
    capacity, as `contract_loads`) sum to more than ``max_load``, every rate times ``max_load / sum``, and
    times ``then`` (the bursts keep their seconds). Returns the description's sentence."""
    raw: list[tuple[int, float, float, float, float] | None] = []  # index, rate, burst_s, attainment, capacity
    for i, (tier, rate, cap) in enumerate(drawn):
        d = part.draw_for(tier)
        if d is None or rate <= 0:  # no contract for a tier without a draw, nor for a tenant that sends nothing
            raw.append(None)
            continue
        frac, burst_s = pick(d)
        raw.append((i, frac * rate, burst_s, d.attainment, cap))
    got = [r for r in raw if r is not None]
    if not got:
        return ""
    total = sum(rps / cap for _, rps, _, _, cap in got)
    # 1e-6 below the bound: the rates are rounded to 6 significant digits after the scaling
    scale = min(1.0, part.max_load / total * (1.0 - 1e-6)) if total > 0 else 1.0
    notes = []
    for i, rps, burst_s, att, cap in got:
        r = _sig(rps * scale * then)
        burst = _sig(max(1.0, burst_s * r))
        tenants[i]["contract"] = {"requests_per_s": r, "burst": burst, "attainment": att}
        notes.append(f"{tenants[i]['name']} {r:.3g} req/s, burst {burst:.3g}, {att:g} ({r / cap:.2f})")
    scaled = (f", all scaled by {scale:.3f} from a load of {total:.2f} to {part.max_load:g}" if scale < 1.0
              else f", a load of {total:.2f}")
    if then != 1.0:
        scaled += f", then all by {then:g}"
    return (f" Contracts {how} each tenant's mean rate (rate, burst, attainment, load): "
            + "; ".join(notes) + scaled + ".")


TYPICAL_CONTRACTS = ContractsPart(max_load=0.8, tiers={
    "interactive": ContractDraw(rate=(0.5, 1.0), burst_s=(2, 10), attainment=0.95),
    "standard": ContractDraw(rate=(0.5, 1.0), burst_s=(5, 30), attainment=0.9),
    "batch": ContractDraw(rate=(0.3, 0.8), burst_s=(30, 120), attainment=0.9),
})
"""The contracts a family draws by default (h200-mix, h200-shift and h200-drift give these ranges) and those
of the bundled scenarios, which take the middle of each range (`typical_contracts`)."""


def slo_tier(slo: Mapping[str, Any]) -> str:
    """A tenant's SLO tier by its objectives: ``interactive`` with a TTFT objective of 0.5 s or less,
    ``standard`` with a looser one, ``batch`` with none (only end-to-end)."""
    ttft = slo.get("ttft_s")
    if ttft is None:
        return "batch"
    return "interactive" if ttft <= 0.5 else "standard"


def typical_contracts(scenario: Scenario, part: ContractsPart = TYPICAL_CONTRACTS,
                      scale: float = 1.0) -> tuple[list[dict[str, Any]], str]:
    """Contracts for a hand-written scenario by a family's rule, without a draw: each tenant's tier from its
    SLO (`slo_tier`), the middle of the tier's rate and burst ranges, scaled down together to ``max_load``,
    then every rate times ``scale`` (the bursts keep their seconds): where one tenant's requests slow
    another's, a load the engine carries can still miss a latency promise (docs/scenarios.md). Returns each
    tenant's ``contract:`` mapping (in tenant order) and the sentence that says how."""
    tenants: list[dict[str, Any]] = [{"name": t.name} for t in scenario.tenants]
    drawn = []
    for i, t in enumerate(scenario.tenants):
        cap = tenant_capacity_rps(scenario, i)
        drawn.append((slo_tier(t.slo.model_dump(exclude_none=True)), float(mean_rate(t.arrival, scenario.horizon_s)),
                      float(cap)))
    note = _give_contracts(part, lambda d: ((d.rate[0] + d.rate[1]) / 2, (d.burst_s[0] + d.burst_s[1]) / 2),
                           tenants, drawn, "at the middle of the typical ranges from", then=scale)
    return [t.get("contract", {}) for t in tenants], note


def _clock(t_s: float) -> str:
    day, rest = divmod(int(t_s), 86400)
    return f"day {day + 1}, {rest // 3600:02d}:{rest % 3600 // 60:02d}"


def sample_scenario(family: Family | str, seed: int) -> Scenario:
    """Instance ``FAMILY@SEED``: deterministic in the seed, validated by the scenario schema."""
    fam = load_family(family) if isinstance(family, str) else family
    return parse_scenario(sample_scenario_data(fam, int(seed)), fam.instance_name(seed))


def instances(family: Family | str, split: Literal["train", "validation", "test"], n: int) -> Iterator[str]:
    """The names of the first ``n`` instances of one seed range, e.g. the test instances a report uses."""
    fam = load_family(family) if isinstance(family, str) else family
    if split not in SPLITS:
        raise FamilyError(f"unknown seed range {split!r}; allowed: {', '.join(SPLITS)}")
    for s in getattr(fam.seeds, split).seeds(n):
        yield fam.instance_name(s)

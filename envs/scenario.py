"""Scenario files: a typed schema for the simulated world, loaded from YAML.

A scenario names the tenants (arrivals, request sizes, SLOs), the engine, the admission settings, the
concurrency bounds, the decision interval, the horizon and the reward weights. Bundled scenarios live in
envs/scenarios/NAME.yaml; any path to a YAML file works too. A bad key or value raises ``ScenarioError``
naming the key and what is allowed. Every number must be finite but the queue timeouts
(``admission.queue_timeout_s``, whose default is none, and a tenant's ``queue_timeout_s``): ``.inf`` there means
no timeout (core/schema.py).

A tenant is written in the words the gateway's and the load generator's configs use for one: one ``slo:``
mapping (core/slo.py), ``queue_timeout_s``, ``max_queue``, ``priority``, ``weight``, and the arrival processes
and size distributions of core/workload.py (plus trace replay and ServeGen clients, envs/workload.py).
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from admit.core.config import ConfigError, error_lines
from admit.core.contract import Contract
from admit.core.schema import StrictModel, Unbounded
from admit.core.slo import SLO
from admit.core.spec import ControlSpec, Limits, TenantSpec
from admit.envs.workload import ArrivalSpec, SizeSpec, Trace
from pydantic import Field, ValidationError, model_validator


class ScenarioError(ConfigError):
    """A scenario could not be found or is invalid; the message says what and what is allowed."""


class ScenarioTenant(StrictModel):
    """One tenant of the simulated world: the load it offers (arrivals, request sizes) and how it is served
    (objectives, weight, priority, queue). Three other classes describe a tenant for another reader and share
    these key names: the gateway's ``TenantConfig`` (API keys, limits, envelopes), the load generator's
    ``TenantLoad`` (what to send a server) and ``TenantSpec`` (what a controller is told, core/spec.py)."""

    name: str = Field(min_length=1)
    arrival: ArrivalSpec
    prompt_tokens: SizeSpec | None = None
    output_tokens: SizeSpec | None = None
    slo: SLO = SLO()
    weight: float = Field(default=1.0, gt=0)
    priority: int = 0
    max_queue: int | None = Field(default=None, ge=0)
    queue_timeout_s: Unbounded | None = Field(default=None, gt=0)  # none: the scenario's admission.queue_timeout_s
    contract: Contract | None = None  # the load it is promised service for (core/contract.py); none: no promise

    @model_validator(mode="after")
    def _sizes(self) -> ScenarioTenant:
        if not isinstance(self.arrival, Trace) and (self.prompt_tokens is None or self.output_tokens is None):
            raise ValueError(
                f"tenant {self.name!r}: prompt_tokens and output_tokens are required unless arrival.kind is 'trace'"
            )
        return self


class SlotEngineConfig(StrictModel):
    kind: Literal["slot"] = "slot"
    slots: int = Field(ge=1)
    mean_service_s: float = Field(gt=0)
    distribution: Literal["exponential", "deterministic"] = "exponential"


class TokenEngineConfig(StrictModel):
    kind: Literal["token"] = "token"
    preset: str = "h200-llama3-8b"
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)


EngineConfig = Annotated[SlotEngineConfig | TokenEngineConfig, Field(discriminator="kind")]


class AdmissionConfig(StrictModel):
    queue_timeout_s: Unbounded = Field(default=math.inf, gt=0)  # inf (the default): a queued request never expires
    max_queue: int = Field(default=1_000_000, ge=0)


class LimitsConfig(StrictModel):
    min: int = Field(default=1, ge=0)
    max: int = Field(default=16, ge=1)
    initial: int = Field(default=4, ge=0)
    max_step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _order(self) -> LimitsConfig:
        if not self.min <= self.initial <= self.max:
            raise ValueError(f"limits need min <= initial <= max, got {self.min}, {self.initial}, {self.max}")
        return self


class RewardConfig(StrictModel):
    """reward = throughput·completions/s + goodput·good/s − slo_violation·violations/s − drop·drops/s − cost·Σlimits.

    ``goodput`` (default 0) rewards the requests that met every per-request objective (core/slo.py): what
    ``admit evaluate`` judges by. A training config can replace these weights (``reward:`` in admit train).
    ``tenant_weights``: count each tenant's completions, good requests, misses and drops times its ``weight``
    (the tenant's share in the weighted-fair controllers), so a heavier tenant's requests are worth more.
    ``contract_miss`` (default 0) costs each in-contract request that is not good (rejected, dropped, late, or
    unfinished at the horizon) of a tenant with a contract, times the tenant's weight: its SLO tier's in
    ``contract_tiers`` (envs/family.py ``slo_tier``: interactive, standard, batch; 1 for a tier not named), and
    its ``weight`` too under ``tenant_weights``. envs/env.py's Rewards say when a miss counts.
    """

    throughput: float = 1.0
    goodput: float = 0.0
    slo_violation: float = 0.5
    drop: float = 1.0
    cost: float = 0.0
    change: float = 0.0
    tenant_weights: bool = False
    contract_miss: float = 0.0
    contract_tiers: dict[Literal["interactive", "standard", "batch"], Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict)


class Scenario(StrictModel):
    name: str
    description: str = ""
    horizon_s: float = Field(gt=0)
    interval_s: float = Field(gt=0)
    window_s: float = Field(gt=0)
    engine: EngineConfig
    admission: AdmissionConfig = AdmissionConfig()
    limits: LimitsConfig = LimitsConfig()
    reward: RewardConfig = RewardConfig()
    tenants: list[ScenarioTenant] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Scenario:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must be unique, got {names}")
        return self

    @model_validator(mode="after")
    def _contracts_feasible(self) -> Scenario:
        """The contracts must fit the engine together: their loads (each contract's requests/s over its tenant's
        capacity, engine/capacity.py) sum to at most 1."""
        if not self.has_contracts:
            return self
        from admit.envs.family import contract_loads  # the capacity estimate reads traces: only when needed

        loads = contract_loads(self)
        total = sum(x for x in loads if x is not None)
        if total > 1.0 + 1e-9:
            each = ", ".join(f"{t.name} {x:.2f}" for t, x in zip(self.tenants, loads, strict=True) if x is not None)
            raise ValueError(f"the contracts ask for {total:.2f} of the engine's estimated capacity ({each}); "
                             "together they must be at most 1.00 (engine/capacity.py estimates each tenant's)")
        return self

    @property
    def has_contracts(self) -> bool:
        """Whether any tenant has a contract (core/contract.py)."""
        return any(t.contract is not None for t in self.tenants)

    def queue_timeout(self, i: int) -> float:
        t = self.tenants[i].queue_timeout_s
        return self.admission.queue_timeout_s if t is None else t

    def max_queue(self, i: int) -> int:
        q = self.tenants[i].max_queue
        return self.admission.max_queue if q is None else q

    def control_spec(self) -> ControlSpec:
        loads: list[float | None] = [None] * len(self.tenants)
        if self.has_contracts:
            from admit.envs.family import contract_loads

            loads = contract_loads(self)
        tenants = tuple(
            TenantSpec(
                name=t.name,
                slo_e2e_p99_s=t.slo.e2e_p99_bound,
                slo_ttft_p99_s=t.slo.ttft_p99_bound,
                weight=t.weight,
                priority=t.priority,
                slo_ttft_s=t.slo.ttft_bound,
                slo_tpot_s=t.slo.tpot_bound,
                slo_e2e_s=t.slo.e2e_bound,
                contract=t.contract,
                contract_load=load,
            )
            for t, load in zip(self.tenants, loads, strict=True)
        )
        lim = self.limits
        return ControlSpec(
            tenants=tenants,
            limits=Limits(min=lim.min, max=lim.max, initial=lim.initial, max_step=lim.max_step),
            interval_s=self.interval_s,
            window_s=self.window_s,
            queue_timeout_s=self.admission.queue_timeout_s,
        )


def bundled_scenarios() -> list[str]:
    folder = resources.files("admit.envs").joinpath("scenarios")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _format_errors(err: ValidationError) -> str:
    return "\n".join(f"  {line}" for line in error_lines(err))


def parse_scenario(data: object, origin: str = "<dict>") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {origin}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(f"scenario {origin} is invalid:\n{_format_errors(e)}") from None


def load_scenario(name_or_path: str | Path, **overrides: object) -> Scenario:
    """Load a bundled scenario by name, a YAML file by path, or an instance of a scenario family by
    ``FAMILY@SEED`` (envs/family.py; FAMILY a bundled family or a family file's path); ``overrides`` replace
    top-level keys."""
    text: str
    origin = str(name_or_path)
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        text = path.read_text()
    elif "@" in origin:
        from admit.envs.family import instance_data  # families load only when an instance is asked for

        data = instance_data(origin)
        return parse_scenario({**data, **overrides} if overrides else data, origin)
    else:
        names = bundled_scenarios()
        if origin not in names:
            from admit.envs.family import bundled_families

            families = ", ".join(f"{f}@SEED" for f in bundled_families())
            raise ScenarioError(
                f"unknown scenario {origin!r}; bundled scenarios: {', '.join(names)}; family instances: "
                f"{families or 'none'} (`admit scenarios` lists their seeds); or a path to a .yaml file"
            )
        text = resources.files("admit.envs").joinpath("scenarios", f"{origin}.yaml").read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"scenario {origin}: not valid YAML: {e}") from None
    if isinstance(data, dict) and overrides:
        data = {**data, **overrides}
    return parse_scenario(data, origin)

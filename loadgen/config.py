"""Typed configuration of a load run: tenants, target, stage settings and sweeps.

A run is described by a YAML file, by command-line flags, or both (flags win). Tenants on the command
line are written ``--tenant name=a,rate=20,arrival=poisson,prompt=32,output=16,api_key=sk-a``. Every
unknown key or bad value raises :class:`ConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from admit.core import config as core_config
from admit.core.config import error_lines
from admit.core.schema import StrictModel
from admit.core.slo import SLO
from admit.loadgen.arrivals import PROCESSES, ArrivalSpec
from admit.loadgen.lengths import LengthDist, parse_length
from pydantic import Field, ValidationError

ARRIVALS = (*PROCESSES, "trace")
APIS = ("completions", "chat")
LADDERS = ("linear", "geometric")
SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "ntpot_ms")


def usable_cores() -> int:
    """Cores this process may run on (respects ``taskset``); the default number of workers."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class ConfigError(core_config.ConfigError):
    """A bad configuration key or value; the message names it and what is allowed."""


class TenantLoad(StrictModel):
    """One tenant's load: how requests arrive, how long they are, and how they identify themselves."""

    name: str
    rate: float = 0.0
    arrival: str = "poisson"
    burstiness: float = 1.0
    rate_start: float = 0.0
    prompt: LengthDist = Field(default_factory=lambda: parse_length(32))
    output: LengthDist = Field(default_factory=lambda: parse_length(16))
    api_key: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    model: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    trace: str | None = None
    trace_speedup: float = 1.0
    trace_tenant: str | None = None
    # the tenant's objectives in the scenario's and the gateway's shape (core/slo.py); the stage summary
    # writes them beside the tenant's measured latencies
    slo: SLO = Field(default_factory=SLO)

    def arrival_spec(self, scale: float = 1.0) -> ArrivalSpec:
        return ArrivalSpec(self.arrival, self.rate * scale, self.burstiness, self.rate_start * scale)


class SweepConfig(StrictModel):
    """A rate ladder: ``linear`` steps ``start + i·(stop-start)/(steps-1)``, ``geometric`` steps
    ``start·(stop/start)^(i/(steps-1))``; rates are totals over all tenants."""

    ladder: str = "geometric"
    start: float = 100.0
    stop: float = 8000.0
    steps: int = 8
    min_achieved: float = 0.95
    max_error_rate: float = 0.01

    def rates(self) -> list[float]:
        import numpy as np

        if self.steps == 1:
            return [self.start]
        if self.ladder == "linear":
            return [float(x) for x in np.linspace(self.start, self.stop, self.steps)]
        return [float(x) for x in np.geomspace(self.start, self.stop, self.steps)]


class RunConfig(StrictModel):
    """Everything one stage (or a sweep of stages) needs.

    The three classes here are StrictModels (core/schema.py): frozen, and every number finite (a stage of
    infinite duration or a request that never times out is a typo here, not a setting). Their values are
    converted from YAML scalars and ``--tenant`` strings by :func:`config_from_mapping` and
    :func:`parse_tenant_flag`, which name the key of a bad value; :meth:`checked` checks the run as a whole.
    """

    url: str = "http://127.0.0.1:8000"
    api: str = "completions"
    model: str | None = None
    duration: float = 30.0
    seed: int = 0
    workers: int = Field(default_factory=usable_cores)
    timeout: float = 60.0
    max_connections: int = 20000
    tenant_header: str | None = None
    ignore_eos: bool = True
    unique_prompts: bool = True
    stream: bool = True  # false: non-streamed requests, each answer timed as one JSON body
    lag_bound_ms: float = 5.0
    min_achieved: float = 0.99
    max_retries: int = 0
    retry_budget: float = 0.1
    throttle: bool = False
    throttle_k: float = 2.0
    warmup: float = 0.0
    slo: dict[str, float] = Field(default_factory=dict)
    tenants: list[TenantLoad] = Field(default_factory=list)
    sweep: SweepConfig | None = None

    @property
    def total_rate(self) -> float:
        return sum(t.rate for t in self.tenants)

    def checked(self) -> RunConfig:
        """``self`` once the run as a whole is checked (tenants, ranges, the sweep); else a ConfigError."""
        if not self.tenants:
            raise ConfigError("no tenants: give at least one --tenant name=...,rate=... or a 'tenants:' list")
        names = [t.name for t in self.tenants]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"tenant names must be unique; repeated: {', '.join(dup)}")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"url must start with http:// or https://, got {self.url!r}")
        _check(self.api in APIS, "api", self.api, f"one of {', '.join(APIS)}")
        _check(self.duration > 0, "duration", self.duration, "a number of seconds > 0")
        _check(self.workers >= 1, "workers", self.workers, "an integer >= 1")
        _check(self.timeout > 0, "timeout", self.timeout, "seconds > 0")
        _check(self.max_connections >= 1, "max_connections", self.max_connections, "an integer >= 1")
        _check(self.lag_bound_ms > 0, "lag_bound_ms", self.lag_bound_ms, "milliseconds > 0")
        _check(0 < self.min_achieved <= 1, "min_achieved", self.min_achieved, "a fraction in (0, 1]")
        _check(self.max_retries >= 0, "max_retries", self.max_retries, "an integer >= 0")
        _check(self.retry_budget >= 0, "retry_budget", self.retry_budget, "a ratio >= 0")
        _check(self.throttle_k >= 1, "throttle_k", self.throttle_k, "a multiplier >= 1")
        _check(0 <= self.warmup < self.duration, "warmup", self.warmup,
               f"seconds >= 0 and < the stage's duration ({self.duration:g} s)")
        for key, value in self.slo.items():
            _check(key in SLO_KEYS, f"slo.{key}", key, f"one of {', '.join(SLO_KEYS)}")
            _check(value > 0, f"slo.{key}", value, "milliseconds > 0")
        for t in self.tenants:
            where = f"tenant {t.name!r}"
            _check(t.arrival in ARRIVALS, f"{where}: arrival", t.arrival, f"one of {', '.join(ARRIVALS)}")
            if t.arrival == "trace":
                _check(bool(t.trace), f"{where}: trace", t.trace, "a CSV or JSONL path when arrival=trace")
                _check(t.trace_speedup > 0, f"{where}: trace_speedup", t.trace_speedup, "a factor > 0")
            else:
                _check(t.rate > 0, f"{where}: rate", t.rate, "requests per second > 0")
                try:
                    t.arrival_spec()
                except ValueError as exc:
                    raise ConfigError(f"{where}: {exc}") from None
        if self.sweep is not None:
            s = self.sweep
            _check(s.ladder in LADDERS, "sweep.ladder", s.ladder, f"one of {', '.join(LADDERS)}")
            _check(s.start > 0, "sweep.start", s.start, "a rate > 0")
            _check(s.stop >= s.start, "sweep.stop", s.stop, f"a rate >= sweep.start ({s.start})")
            _check(s.steps >= 1, "sweep.steps", s.steps, "an integer >= 1")
            _check(0 < s.min_achieved <= 1, "sweep.min_achieved", s.min_achieved, "a fraction in (0, 1]")
            _check(0 <= s.max_error_rate <= 1, "sweep.max_error_rate", s.max_error_rate, "a fraction in [0, 1]")
            if any(t.arrival == "trace" for t in self.tenants):
                raise ConfigError("a sweep scales tenant rates; trace tenants cannot be swept (use trace_speedup)")
        return self


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {value!r} is not allowed; expected {allowed}")


def _coerce(key: str, value: Any, target: Any) -> Any:
    """Convert a raw value (string from the command line, or YAML scalar) to the field's type."""
    try:
        if target in (LengthDist, "LengthDist"):
            try:
                return parse_length(value, key)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if target in ("bool", bool):
            if isinstance(value, bool):
                return value
            low = str(value).lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if target in ("int", int):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("expected an integer")
            return int(value)
        if target in ("float", float):
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(value)
        if target in ("str", str, "str | None"):
            if isinstance(value, dict | list):
                raise ValueError("expected a string")
            return None if value is None else str(value)
    except ValueError as exc:
        raise ConfigError(f"{key}: {value!r} is not valid ({exc})") from None
    return value


def _slo(key: str, value: Any) -> SLO:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping of objectives ({', '.join(SLO.model_fields)}), got {value!r}")
    try:
        return SLO.model_validate(value)
    except ValidationError as exc:
        lines = "; ".join(f"{key}.{line}" for line in error_lines(exc))
        raise ConfigError(f"{lines} (keys: {', '.join(SLO.model_fields)})") from None


def _from_mapping(cls: type[StrictModel], data: dict[str, Any], where: str,
                  skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``data``'s values converted to the types of ``cls``'s fields, a bad key or value named with ``where``."""
    fields = {name: f.annotation for name, f in cls.model_fields.items() if name not in skip}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(fields))}")
        ftype = fields[key]
        if ftype in (dict[str, str], dict[str, Any], dict[str, float]):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {key} must be a mapping, got {value!r}")
            if ftype == dict[str, str]:
                value = {str(k): str(v) for k, v in value.items()}
            elif ftype == dict[str, float]:
                value = {str(k): _coerce(f"{where}: {key}.{k}", v, float) for k, v in value.items()}
            out[key] = value
        elif ftype in (float, int, bool, LengthDist):
            out[key] = _coerce(f"{where}: {key}", value, ftype)
        elif ftype is SLO:
            out[key] = _slo(f"{where}: {key}", value)
        else:
            out[key] = _coerce(f"{where}: {key}", value, str)
    return out


M = TypeVar("M", bound=StrictModel)


def build(cls: type[M], values: dict[str, Any], where: str) -> M:
    """``cls`` from ``values`` already of the fields' types; what the schema refuses (a number that is not
    finite) is a :class:`ConfigError` naming ``where`` and the key."""
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        raise ConfigError("; ".join(f"{where}: {line}" for line in error_lines(exc))) from None


def updated(model: M, values: dict[str, Any], where: str) -> M:
    """``model`` with ``values`` in place of its own, checked as a new one would be (``model_copy`` is not)."""
    return build(type(model), {**dict(model), **values}, where)


def tenant_from_mapping(data: dict[str, Any], index: int = 0) -> TenantLoad:
    if not isinstance(data, dict):
        raise ConfigError(f"tenants[{index}]: expected a mapping of keys, got {type(data).__name__}")
    where = f"tenants[{index}]" if "name" not in data else f"tenant {data['name']!r}"
    if "name" not in data:
        raise ConfigError(f"{where}: every tenant needs a 'name'")
    return build(TenantLoad, _from_mapping(TenantLoad, data, where), where)


def parse_tenant_flag(text: str) -> TenantLoad:
    """Parse ``name=a,rate=20,...``; ``header=Name:Value`` may repeat and adds a request header."""
    data: dict[str, Any] = {}
    headers: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ConfigError(f"--tenant {text!r}: {part!r} is not key=value")
        key, value = (s.strip() for s in part.split("=", 1))
        if key == "header":
            if ":" not in value:
                raise ConfigError(f"--tenant {text!r}: header must be Name:Value, got {value!r}")
            hk, hv = value.split(":", 1)
            headers[hk.strip()] = hv.strip()
            continue
        if key in data:
            raise ConfigError(f"--tenant {text!r}: key {key!r} given twice")
        data[key] = value
    if headers:
        data["headers"] = headers
    return tenant_from_mapping(data)


def load_yaml(path: str | Path) -> RunConfig:
    """Read a run file (see docs/loadgen.md for the schema)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from None
    return config_from_mapping(raw, str(p))


def config_from_mapping(raw: dict[str, Any], where: str = "config") -> RunConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a mapping")
    raw = dict(raw)
    tenants_raw = raw.pop("tenants", [])
    sweep_raw = raw.pop("sweep", None)
    if not isinstance(tenants_raw, list):
        raise ConfigError(f"{where}: tenants must be a list of mappings")
    kwargs = _from_mapping(RunConfig, raw, where, skip=("tenants", "sweep"))
    kwargs["tenants"] = [tenant_from_mapping(t, i) for i, t in enumerate(tenants_raw)]
    if sweep_raw is not None:
        at = f"{where}: sweep"
        kwargs["sweep"] = build(SweepConfig, _from_mapping(SweepConfig, sweep_raw, at), at)
    return build(RunConfig, kwargs, where)

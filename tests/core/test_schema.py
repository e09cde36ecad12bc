"""One strict base for every configuration schema (core/schema.py) and its one rule for non-finite numbers."""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import pkgutil
import tomllib
from pathlib import Path

import pytest
import yaml
from admit.agents.llm_config import load_config as load_llm
from admit.core.config import ConfigError
from admit.core.schema import StrictModel, Unbounded
from admit.core.slo import SLO
from admit.core.workload import Poisson
from admit.envs.family import FamilyError, load_family
from admit.envs.scenario import AdmissionConfig, ScenarioTenant, load_scenario, parse_scenario
from admit.gateway.config import parse_config as parse_gateway
from admit.loadgen.cli import build_config as loadgen_flags
from admit.loadgen.config import config_from_mapping as loadgen_mapping
from admit.loadgen.config import parse_tenant_flag
from admit.train.config import parse_config as parse_train
from pydantic import BaseModel, ValidationError

ROOT = Path(__file__).resolve().parents[2]
# admit's sub-packages live in top-level folders that pyproject.toml maps onto admit.* (as scripts/typecheck.sh reads)
PACKAGES = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"])
# *Config classes that are not StrictModels, and why
NOT_STRICT = {
    # the emulator imports no pydantic, so that it starts fast (tests and benchmarks start many); its
    # dataclass refuses non-finite numbers itself, so the policy is the same
    "admit.emulator.config.EmulatorConfig": "starts without pydantic; refuses non-finite numbers itself",
}
# the only fields where infinity means something ("no bound"): the queue timeouts, as a scenario writes them
# and as the admission core takes them
UNBOUNDED_FIELDS = {"AdmissionConfig.queue_timeout_s", "ScenarioTenant.queue_timeout_s", "QueueConfig.queue_timeout_s"}


def _all_modules() -> list[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if not m.ispkg and not m.name.endswith("__main__"):
                names.add(m.name)
    return sorted(names)


@pytest.fixture(scope="module")
def models() -> list[type[BaseModel]]:
    """Every pydantic model defined in the admit package, after importing every one of its modules."""
    for name in _all_modules():
        importlib.import_module(name)
    found: list[type[BaseModel]] = []
    todo = [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("admit.") and sub is not StrictModel:
                found.append(sub)
    return found


def test_every_pydantic_model_of_admit_derives_from_the_strict_base(models: list[type[BaseModel]]) -> None:
    names = {m.__qualname__ for m in models}
    assert {"Scenario", "Family", "TrainConfig", "GatewayConfig", "SLO", "Poisson", "Trace"} <= names  # found them
    loose = [f"{m.__module__}.{m.__qualname__}" for m in models if not issubclass(m, StrictModel)]
    assert not loose, f"pydantic models not derived from admit.core.schema.StrictModel: {loose}"
    for m in models:  # and none loosens the base's rules
        cfg = m.model_config
        assert (cfg.get("extra"), cfg.get("frozen"), cfg.get("allow_inf_nan")) == ("forbid", True, False), m


def test_every_config_class_derives_from_the_strict_base() -> None:
    """A class named ``*Config`` is a configuration and follows the one base's rules, dataclasses included;
    the exceptions are listed here with their reason."""
    loose = set()
    for name in _all_modules():
        for cls in vars(importlib.import_module(name)).values():
            if (inspect.isclass(cls) and cls.__module__ == name and cls.__name__.endswith("Config")
                    and not issubclass(cls, StrictModel)):
                loose.add(f"{name}.{cls.__qualname__}")
    assert "admit.agents.llm_config.LLMConfig" not in loose  # the check sees the classes it is about
    assert loose == set(NOT_STRICT), f"*Config classes not on admit.core.schema.StrictModel: {sorted(loose)}"


def test_no_two_configuration_classes_share_a_name(models: list[type[BaseModel]]) -> None:
    where: dict[str, set[str]] = {}
    for name in _all_modules():
        for cls in vars(importlib.import_module(name)).values():
            if inspect.isclass(cls) and cls.__module__ == name:
                where.setdefault(cls.__name__, set()).add(name)
    configs = {n for n in where if n.endswith("Config") or n.startswith("Tenant")}
    shared = {n: sorted(where[n]) for n in configs if len(where[n]) > 1}
    assert not shared, f"one name, several classes: {shared}"
    schemas = [m.__name__ for m in models]
    assert len(schemas) == len(set(schemas)), sorted(n for n in schemas if schemas.count(n) > 1)


def test_only_core_schema_configures_pydantic() -> None:
    """No module but core/schema.py subclasses pydantic's BaseModel or sets a model_config: a new schema
    derives from StrictModel and so cannot drift from its rules."""
    bases = {"BaseModel", "RootModel", "ConfigDict", "create_model", "dataclasses"}
    bad = []
    for name in _all_modules():
        if name == "admit.core.schema":
            continue
        tree = ast.parse(Path(importlib.import_module(name).__file__ or "").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pydantic") and (
                    node.module == "pydantic.dataclasses" or any(a.name in bases for a in node.names)):
                bad.append(f"{name}: from {node.module} import {', '.join(a.name for a in node.names)}")
            if isinstance(node, ast.Name) and node.id == "model_config" and isinstance(node.ctx, ast.Store):
                bad.append(f"{name}: sets model_config")
    assert not bad, bad


def test_the_unbounded_fields_are_the_queue_timeouts(models: list[type[BaseModel]]) -> None:
    """Infinity is allowed nowhere else: a new exception is a decision this list records."""
    unbounded = {f"{m.__name__}.{field}" for m in models for field, info in m.model_fields.items()
                 if "allow_inf_nan=True" in repr(info)}  # Unbounded, bare or inside Optional
    assert unbounded == UNBOUNDED_FIELDS


# ------------------------------------------------------------------ the policy, loader by loader
def _seed_paper() -> dict:
    return load_scenario("seed-paper").model_dump()


def _family_yaml(tmp_path: Path, section: str, key: str, value: float) -> Path:
    data = yaml.safe_load((ROOT / "envs" / "families" / "h200-mix.yaml").read_text())
    data.setdefault(section, {})[key] = value
    path = tmp_path / "family.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _with(data: dict, path: tuple, value: object) -> dict:
    node = data
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return data


GATEWAY = {"auth": {"mode": "api_key"}, "tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"]}]}


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(
    ("load", "key"),
    [
        (lambda v: parse_scenario(_with(_seed_paper(), ("horizon_s",), v)), "horizon_s"),
        (lambda v: parse_scenario(_with(_seed_paper(), ("reward", "cost"), v)), "reward.cost"),
        (lambda v: parse_scenario(_with(_seed_paper(), ("tenants", 0, "weight"), v)), "tenants.0.weight"),
        (lambda v: parse_train({"hyperparams": {"learning_rate": v}}), "hyperparams.learning_rate"),
        (lambda v: parse_train({"reward": {"drop": v}}), "reward.drop"),
        (lambda v: parse_gateway({**GATEWAY, "backend_timeout_s": v}), "backend_timeout_s"),
        (lambda v: parse_gateway({"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], "weight": v}]}),
         "tenants.0.weight"),
        (lambda v: load_llm(env={"ADMIT_LLM_TIMEOUT_S": str(v)}), "timeout_s"),
        (lambda v: load_llm(env={"ADMIT_LLM_CALLS_PER_MIN": str(v)}), "calls_per_min"),
        (lambda v: loadgen_mapping({"duration": v}), "duration"),
        (lambda v: loadgen_mapping({"timeout": v}), "timeout"),
        (lambda v: loadgen_mapping({"slo": {"ttft_ms": v}}), "slo.ttft_ms"),
        (lambda v: loadgen_mapping({"sweep": {"stop": v}}), "sweep: stop"),
        (lambda v: loadgen_mapping({"tenants": [{"name": "a", "rate": v}]}), "tenant 'a': rate"),
        (lambda v: parse_tenant_flag(f"name=a,rate=1,trace_speedup={v}"), "tenant 'a': trace_speedup"),
        (lambda v: loadgen_flags(None, {"duration": v}, None, None), "command line: duration"),
    ],
)
def test_a_non_finite_number_is_refused_naming_the_key(load, key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"{key}: Input should be a finite number"):
        load(value)


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_family_slo_and_workload_refuse_non_finite_numbers(tmp_path: Path, value: float) -> None:
    with pytest.raises(FamilyError, match="load.max: Input should be a finite number"):
        load_family(_family_yaml(tmp_path, "load", "max", value))
    with pytest.raises(ValidationError, match="finite number"):
        SLO(e2e_s=value)
    with pytest.raises(ValidationError, match="finite number"):
        Poisson(rate=value)


def test_an_infinite_queue_timeout_means_none_and_survives_a_round_trip() -> None:
    text = (ROOT / "envs" / "scenarios" / "seed-paper.yaml").read_text()
    data = yaml.safe_load(text.replace("queue_timeout_s: 3", "queue_timeout_s: .inf"))
    data["tenants"][0]["queue_timeout_s"] = 5.0
    data["tenants"][1]["queue_timeout_s"] = math.inf
    sc = parse_scenario(data)
    assert sc.admission.queue_timeout_s == math.inf and sc.control_spec().queue_timeout_s == math.inf
    assert (sc.queue_timeout(0), sc.queue_timeout(1)) == (5.0, math.inf)
    without = {k: v for k, v in _seed_paper().items() if k != "admission"}
    assert parse_scenario(parse_scenario(without).model_dump()).admission.queue_timeout_s == math.inf


@pytest.mark.parametrize("value", [math.nan, -math.inf, 0.0])
def test_an_unbounded_timeout_still_refuses_nan_and_what_its_bounds_refuse(value: float) -> None:
    with pytest.raises(ValidationError) as err:
        AdmissionConfig(queue_timeout_s=value)
    assert err.value.errors()[0]["loc"] == ("queue_timeout_s",)
    with pytest.raises(ValidationError):
        ScenarioTenant.model_validate({**_seed_paper()["tenants"][0], "queue_timeout_s": value})


def test_nan_in_an_unbounded_field_says_how_to_write_no_bound() -> None:
    with pytest.raises(ValidationError, match=r"NaN is not allowed; write \.inf for no bound"):
        ScenarioTenant.model_validate({**_seed_paper()["tenants"][0], "queue_timeout_s": math.nan})


def test_unbounded_is_the_one_exception() -> None:
    class Probe(StrictModel):
        bound: float = 1.0
        unbounded: Unbounded = 1.0

    assert Probe(unbounded=math.inf).unbounded == math.inf
    with pytest.raises(ValidationError, match="finite number"):
        Probe(bound=math.inf)
    with pytest.raises(ValidationError, match="unknown|Extra inputs"):
        Probe.model_validate({"bound": 1.0, "typo": 2})
    with pytest.raises(ValidationError, match="frozen"):
        Probe().bound = 2.0  # type: ignore[misc]

"""One error type for a bad configuration, and renamed keys that keep working with a warning."""

from __future__ import annotations

import warnings

import pytest
from admit.agents.llm_config import load_config
from admit.core.config import ConfigError, DeprecatedKeyWarning, renamed_keys
from admit.emulator.config import EmulatorConfig
from admit.emulator.faults import FaultError
from admit.envs.scenario import ScenarioError, load_scenario
from admit.gateway.config import ConfigError as GatewayConfigError
from admit.gateway.config import parse_config
from admit.loadgen.config import ConfigError as LoadgenConfigError
from admit.loadgen.config import parse_tenant_flag
from admit.train.config import TrainConfigError


@pytest.mark.parametrize("cls", [ScenarioError, GatewayConfigError, LoadgenConfigError, TrainConfigError, FaultError])
def test_every_config_error_is_one_base_and_still_a_value_error(cls: type) -> None:
    assert issubclass(cls, ConfigError) and issubclass(cls, ValueError)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: load_scenario("no-such-scenario"),
        lambda: parse_config({"tenants": []}),
        lambda: parse_tenant_flag("name=a,rat=2"),
        lambda: EmulatorConfig(port=-1),
        lambda: load_config("ftp://x", env={}),
    ],
)
def test_one_except_clause_catches_every_loader(bad) -> None:
    with pytest.raises(ConfigError):
        bad()


def test_renamed_keys_moves_flat_and_nested_and_warns_once_per_key() -> None:
    with pytest.warns(DeprecatedKeyWarning) as record:
        out = renamed_keys({"a": 1, "old": 2, "flat": 3, "slo": {"x": 4}}, {"old": "new", "flat": "slo.y"}, "t", "doc")
    assert out == {"a": 1, "new": 2, "slo": {"x": 4, "y": 3}}
    assert len(record) == 2 and "t: 'old' is deprecated" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = {"new": 1}
        assert renamed_keys(same, {"old": "new"}, "t", "doc") is same  # nothing old: nothing copied, no warning
        assert renamed_keys([1], {"old": "new"}, "t", "doc") == [1]
    with pytest.raises(ConfigError, match="both 'old' and its new name 'new'"):
        renamed_keys({"old": 1, "new": 2}, {"old": "new"}, "t", "doc")
    with pytest.raises(ConfigError, match="'slo' is not a mapping"):
        renamed_keys({"flat": 1, "slo": 3}, {"flat": "slo.y"}, "t", "doc")

"""Swapping the LLM policy's model, URL and prompt: settings precedence, clear errors, prompt files, the
registry's ``llm:`` prefix, and the small parts (token bucket, LRU cache) on their own."""

from __future__ import annotations

import pytest
from admit.agents.llm_config import LOCAL_API_KEY, load_config
from admit.agents.llm_prompt import PromptTemplate, build_messages, snapshot
from admit.agents.prompt_cache import LRUCache
from admit.agents.rate_budget import TokenBucket
from admit.agents.registry import make_controller
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec, TenantSpec


def test_precedence_file_then_environment_then_argument(tmp_path) -> None:
    f = tmp_path / "llm.yaml"
    f.write_text("base_url: http://file:1/v1\nmodel: from-file\nevery: 4\ncalls_per_min: 30\n")
    cfg = load_config(str(f), env={"ADMIT_LLM_MODEL": "from-env"})
    assert (cfg.base_url, cfg.model, cfg.every, cfg.calls_per_min) == ("http://file:1/v1", "from-env", 4, 30.0)
    cfg = load_config("http://arg:2/v1", env={"ADMIT_LLM_CONFIG": str(f), "ADMIT_LLM_URL": "http://env:3/v1"})
    assert (cfg.base_url, cfg.model) == ("http://arg:2/v1", "from-file")


def test_api_key_falls_back_to_openai_key_then_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert load_config(env={}).resolved_api_key() == LOCAL_API_KEY
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert load_config(env={}).resolved_api_key() == "sk-openai"
    assert load_config(env={"ADMIT_LLM_API_KEY": "sk-admit"}).resolved_api_key() == "sk-admit"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("modle: x\n", "unknown key 'modle'"),
        ("every: often\n", "every must be int"),
        ("every: 0\n", "every: Input should be greater than or equal to 1"),
        ("base_url: ftp://x\n", "base_url: Value error, must start with http"),
        ("- a list\n", "expected a mapping"),
    ],
)
def test_bad_settings_name_the_key(tmp_path, text: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config(str(f), env={})


def test_prompt_file_replaces_the_template(tmp_path) -> None:
    spec = ControlSpec(tenants=(TenantSpec("a", slo_e2e_p99_s=2.0), TenantSpec("b")))
    obs = Observation(0.0, 6.0, 0.1, 1, 0, [TenantObservation(queue_depth=7), TenantObservation()])
    f = tmp_path / "prompt.yaml"
    f.write_text("system: 'Be brief. Deltas within ±$max_step.'\nuser: |\n  Tenants $names\n  $table\n")
    msgs = build_messages(PromptTemplate.from_file(f), spec, obs, [snapshot(obs)])
    assert msgs[0] == {"role": "system", "content": "Be brief. Deltas within ±1."}
    assert msgs[1]["content"].startswith("Tenants a, b\ntenant | queue")
    assert "\na | 7 |" in msgs[1]["content"]
    f.write_text("sytem: typo\n")
    with pytest.raises(ValueError, match="keys 'system' and/or 'user'"):
        PromptTemplate.from_file(f)


def test_registry_builds_the_policy_from_the_prefix() -> None:
    p = make_controller("llm:http://127.0.0.1:9/v1")
    assert p.name == "llm"
    assert p.config.base_url == "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]


def test_token_bucket_refills_at_the_configured_rate() -> None:
    now = [0.0]
    b = TokenBucket(calls_per_min=30, burst=2, clock=lambda: now[0])
    assert [b.try_take() for _ in range(3)] == [True, True, False]
    now[0] = 1.9  # 0.5 tokens per second: not yet one token
    assert not b.try_take()
    now[0] = 2.0
    assert b.try_take() and not b.try_take()
    now[0] = 100.0  # never more than the burst
    assert [b.try_take() for _ in range(3)] == [True, True, False]


def test_lru_cache_evicts_the_least_recently_used() -> None:
    c: LRUCache[int] = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3)
    assert (c.get("a"), c.get("b"), c.get("c"), len(c)) == (1, None, 3, 2)

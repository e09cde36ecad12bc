"""The gateway's config schema: a bad key or value is an error that names the key and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from admit.core.tokens import estimate_chat_tokens
from admit.gateway.body import BadBody, parse_request
from admit.gateway.config import ConfigError, load_config, parse_config


def cfg(**over: Any) -> dict[str, Any]:
    return {"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"]}], **over}


def error(data: Any) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "t.yaml")
    return str(exc.value)


def test_valid_config_and_defaults() -> None:
    c = parse_config(cfg(capacity=8))
    assert c.tenants[0].limit == 4 and c.auth.mode == "api_key" and c.capacity == 8


def test_the_modules_example_is_a_valid_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml
    from admit.gateway import config

    monkeypatch.setenv("ADMIT_ADMIN_TOKEN", "admin-token-0123456789")
    example = yaml.safe_load((config.__doc__ or "").split("Example::")[1].split("Secrets")[0])
    c = parse_config(example)
    assert c.capacity == 32 and c.tenants[0].borrow == 8 and c.tenants[0].envelopes[0].requests_per_s == 20


def test_unknown_key_names_it_and_the_allowed_keys() -> None:
    msg = error(cfg(capacty=3))
    assert "capacty" in msg and "allowed keys" in msg and "capacity" in msg
    msg = error({"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], "limt": 3}]})
    assert "tenants.0.limt" in msg and "limit" in msg and "max_queue" in msg


def test_bad_values_name_the_key_and_allowed_values() -> None:
    msg = error(cfg(auth={"mode": "magic"}))
    assert "auth.mode" in msg and "api_key" in msg and "trusted_header" in msg and "magic" in msg
    assert "tenants.0.limit" in error({"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], "limit": -1}]})
    assert "at least 1" in error({"tenants": []})
    assert "listed twice" in error({"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"]},
                                                {"name": "a", "api_keys": ["sk-bbbbbbbb"]}]})
    assert "without api_keys" in error({"tenants": [{"name": "a"}]})
    assert "capacity" in error({"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], "borrow": 2}]})
    env = {"name": "a", "api_keys": ["sk-aaaaaaaa"], "envelopes": [{"target": "*"}]}
    assert "requests_per_s or tokens_per_s" in error({"tenants": [env]})
    assert "mapping" in error([1, 2])
    msg = error(cfg(connections={"send_buffer_bytes": 100}))
    assert "connections.send_buffer_bytes" in msg and "4096" in msg


def test_token_env_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    assert "NO_SUCH_TOKEN_VAR" in error(cfg(admin={"token_env": "NO_SUCH_TOKEN_VAR"}))


def test_load_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_request_body_validation_and_estimate() -> None:
    # the emulator's estimate (core/tokens.py): a long word is two pieces, plus the beginning-of-text token
    info = parse_request(b'{"model":"m","prompt":"abcdefgh","max_tokens":10,"stream":true}', chat=False)
    assert (info.model, info.stream, info.prompt_tokens, info.cost_tokens(None, 256)) == ("m", True, 3, 13)
    assert parse_request(b'{"model":"m","prompt":[1,2,3]}', chat=False).prompt_tokens == 3
    chat = parse_request(b'{"model":"m","messages":[{"role":"user","content":"abcd"}]}', chat=True)
    # beginning of text + the answer's header + (the message's header and end + one word)
    assert chat.prompt_tokens == 1 + 4 + (4 + 1) and chat.max_tokens is None
    messages = [{"role": "system", "content": "Be brief, please."}, {"role": "user", "content": "hello " * 30}]
    assert parse_request(json.dumps({"model": "m", "messages": messages}).encode(), chat=True).prompt_tokens == (
        estimate_chat_tokens([{"text": m["content"]} for m in messages]))  # exactly what the emulator counts
    assert parse_request(b'{"model":"m","prompt":"' + b" hello" * 50 + b'"}', chat=False).prompt_tokens == 51
    for bad in (b"[]", b"{", b'{"prompt":"x"}', b'{"model":"m","prompt":"x","max_tokens":"9"}',
                b'{"model":"m","prompt":"x","stream":"yes"}', b'{"model":"m","prompt":{}}'):
        with pytest.raises(BadBody):
            parse_request(bad, chat=False)
    with pytest.raises(BadBody, match="messages"):
        parse_request(b'{"model":"m","messages":[]}', chat=True)


def _cost(body: dict[str, object], chat: bool, context: int | None = 1000, default: int = 256) -> int:
    fields = {"model": "m", **({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": [1] * 10})}
    return parse_request(json.dumps({**fields, **body}).encode(), chat=chat).cost_tokens(context, default)


def test_the_charge_up_front_is_the_most_the_backend_may_generate() -> None:
    """The output limit is read as vLLM reads it, so no spelling of a request is charged less than it may get."""
    p = 1 + 4 + (4 + 1)  # the chat prompt's estimate
    # chat: max_completion_tokens wins over max_tokens, whichever is smaller
    assert _cost({"max_tokens": 1, "max_completion_tokens": 500}, chat=True) == p + 500
    assert _cost({"max_tokens": 500, "max_completion_tokens": 1}, chat=True) == p + 1
    assert _cost({"max_tokens": 7, "max_completion_tokens": None}, chat=True) == p + 7
    # chat naming no limit may run to the end of the context; while the context is unknown, the default stands in
    assert _cost({}, chat=True) == 1000 and _cost({}, chat=True, context=None) == p + 256
    # capped by the context (the backend caps the output quietly), once per choice: n, or best_of if larger
    assert _cost({"max_completion_tokens": 5000}, chat=True) == 1000
    assert _cost({"max_tokens": 50, "n": 3}, chat=True) == p + 150
    assert _cost({"max_tokens": 50, "n": 2, "best_of": 4}, chat=False) == 10 + 200
    # completions: max_tokens only (max_completion_tokens is not a completions field), else vLLM's 16
    assert _cost({"max_completion_tokens": 500}, chat=False) == 10 + 16
    assert _cost({"max_tokens": None}, chat=False) == 10 + 16
    for bad in ({"max_completion_tokens": 0}, {"max_completion_tokens": "9"}, {"best_of": 0}, {"best_of": 129},
                {"n": True}, {"max_tokens": 2_000_000}):
        with pytest.raises(BadBody, match=next(iter(bad))):
            _cost(bad, chat=True)


def test_tenant_keys_are_the_shared_vocabulary() -> None:
    c = parse_config({"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], "queue_timeout_s": 5,
                                   "slo": {"e2e_p99_s": 12, "ttft_p99_s": 2}}]})
    t = c.tenants[0]
    assert t.queue_timeout_s == 5 and t.slo.e2e_p99_s == 12 and t.slo.ttft_p99_s == 2
    msg = error({"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], "slo": {"e2e_p99": 12}}]})
    assert "tenants.0.slo.e2e_p99" in msg and "e2e_p99_s" in msg and "ttft_p99_s" in msg  # the allowed keys


@pytest.mark.parametrize(
    "old, new, read",
    [
        ({"queue_ttl_s": 5}, "queue_timeout_s", lambda t: t.queue_timeout_s == 5),
        ({"slo_e2e_p99_s": 12}, "slo.e2e_p99_s", lambda t: t.slo.e2e_p99_s == 12 and t.slo.ttft_p99_s is None),
        ({"slo_ttft_p99_s": 2}, "slo.ttft_p99_s", lambda t: t.slo.ttft_p99_s == 2 and t.slo.e2e_p99_s is None),
    ],
)
def test_old_tenant_key_names_still_load_and_warn(old: dict[str, Any], new: str, read: Any) -> None:
    from admit.core.config import DeprecatedKeyWarning

    with pytest.warns(DeprecatedKeyWarning, match=rf"tenant 'a': '{next(iter(old))}' is deprecated.*'{new}'"):
        c = parse_config({"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], **old}]})
    assert read(c.tenants[0])


def test_old_and_new_name_of_one_key_is_an_error() -> None:
    both = {"name": "a", "api_keys": ["sk-aaaaaaaa"], "queue_ttl_s": 5, "queue_timeout_s": 6}
    assert "both 'queue_ttl_s' and its new name 'queue_timeout_s'" in error({"tenants": [both]})
    both = {"name": "a", "api_keys": ["sk-aaaaaaaa"], "slo_e2e_p99_s": 5, "slo": {"e2e_p99_s": 6}}
    assert "both 'slo_e2e_p99_s' and its new name 'slo.e2e_p99_s'" in error({"tenants": [both]})


def test_api_keys_from_an_environment_variable_join_the_listed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAT_KEYS", " sk-chat-from-env-1 ,sk-chat-from-env-2,")
    c = parse_config({"tenants": [{"name": "chat", "api_keys": ["sk-chat-inline"], "api_keys_env": "CHAT_KEYS"}]})
    assert c.tenants[0].api_keys == ("sk-chat-inline", "sk-chat-from-env-1", "sk-chat-from-env-2")
    assert len(c.key_index()) == 3


@pytest.mark.parametrize(("value", "message"), [
    (None, "environment variable CHAT_KEYS is not set"),
    (" , ", "CHAT_KEYS holds no key"),
    ("sk-long-enough-1,short", "1 key(s) in CHAT_KEYS are shorter than 8 characters"),
])
def test_bad_api_keys_env_is_refused_without_showing_a_key(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                           message: str) -> None:
    if value is None:
        monkeypatch.delenv("CHAT_KEYS", raising=False)
    else:
        monkeypatch.setenv("CHAT_KEYS", value)
    msg = error({"tenants": [{"name": "chat", "api_keys_env": "CHAT_KEYS"}]})
    assert message in msg and "tenant 'chat'" in msg and "sk-long" not in msg and "short," not in msg


def test_max_limit_is_a_ceiling_the_initial_limit_must_respect() -> None:
    def one(**kw: int) -> dict[str, Any]:
        return {"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], **kw}]}

    assert parse_config(one(limit=3, max_limit=3)).tenants[0].max_limit == 3
    assert "tenant 'a': limit 4 is above its max_limit 3" in error(one(limit=4, max_limit=3))


def test_min_limit_is_a_floor_the_initial_limit_must_respect() -> None:
    def one(**kw: int) -> dict[str, Any]:
        return {"tenants": [{"name": "a", "api_keys": ["sk-aaaaaaaa"], **kw}]}

    assert parse_config(one(limit=3, min_limit=3, max_limit=5)).tenants[0].min_limit == 3
    assert "tenant 'a': limit 2 is below its min_limit 3" in error(one(limit=2, min_limit=3))

"""The gateway's config schema: a bad key or value is an error that names the key and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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
    info = parse_request(b'{"model":"m","prompt":"abcdefgh","max_tokens":10,"stream":true}', chat=False)
    assert (info.model, info.stream, info.prompt_tokens, info.cost_tokens) == ("m", True, 2, 12)
    assert parse_request(b'{"model":"m","prompt":[1,2,3]}', chat=False).prompt_tokens == 3
    chat = parse_request(b'{"model":"m","messages":[{"role":"user","content":"abcd"}]}', chat=True)
    assert chat.prompt_tokens == 1 + 4 and chat.max_tokens == 16
    for bad in (b"[]", b"{", b'{"prompt":"x"}', b'{"model":"m","prompt":"x","max_tokens":"9"}',
                b'{"model":"m","prompt":"x","stream":"yes"}', b'{"model":"m","prompt":{}}'):
        with pytest.raises(BadBody):
            parse_request(bad, chat=False)
    with pytest.raises(BadBody, match="messages"):
        parse_request(b'{"model":"m","messages":[]}', chat=True)

"""Settings of the LLM-prompted policy: where the model lives, how often and how fast to ask it.

Resolution order (later wins): the defaults below, a YAML file, environment variables, the policy
argument. On the command line ``--policy llm:URL`` gives the base URL and ``--policy llm:FILE.yaml`` a
settings file; ``ADMIT_LLM_CONFIG`` names a settings file too. Environment variables:

    ADMIT_LLM_URL            base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8080/v1
    ADMIT_LLM_MODEL          model name sent with every request
    ADMIT_LLM_API_KEY        API key (falls back to OPENAI_API_KEY, then to a placeholder for local servers)
    ADMIT_LLM_EVERY          decide every K control intervals, hold in between
    ADMIT_LLM_CALLS_PER_MIN  rate budget of the policy's own calls (token bucket refill)
    ADMIT_LLM_TIMEOUT_S      per-request timeout; a late reply becomes a hold
    ADMIT_LLM_LOG            JSONL file that receives every decision with its rationale
    ADMIT_LLM_PROMPT         prompt template file (see admit.agents.llm_prompt for the fields)

A bad key or value is an error that names the key and what is allowed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from admit.core.config import ConfigError, error_lines
from admit.core.schema import StrictModel
from pydantic import Field, ValidationError, field_validator

LOCAL_API_KEY = "sk-local"  # llama.cpp and vLLM accept any key when started without one


class LLMConfig(StrictModel):
    """The policy's settings: unknown keys refused, frozen, every number finite (core/schema.py). A timeout
    must be finite too: a late reply becomes a hold, and a reply never waited out would stall the loop."""

    base_url: str = "http://127.0.0.1:8080/v1"
    model: str = "local"
    api_key: str = ""
    timeout_s: float = Field(default=10.0, gt=0)
    max_tokens: int = Field(default=200, ge=16)
    temperature: float = Field(default=0.0, ge=0)
    every: int = Field(default=1, ge=1)
    calls_per_min: float = Field(default=120.0, gt=0)
    burst: int = Field(default=5, ge=1)
    history: int = Field(default=8, ge=2)
    cache_size: int = Field(default=256, ge=0)
    log_path: str = ""
    log_keep: int = Field(default=1000, ge=1)
    prompt_file: str = ""

    @field_validator("base_url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {url!r}")
        return url

    def resolved_api_key(self) -> str:
        return self.api_key or os.environ.get("OPENAI_API_KEY", "") or LOCAL_API_KEY


_KINDS: dict[Any, type] = {str: str, int: int, float: float}  # the types LLMConfig's fields have

_ENV = {
    "ADMIT_LLM_URL": "base_url",
    "ADMIT_LLM_MODEL": "model",
    "ADMIT_LLM_API_KEY": "api_key",
    "ADMIT_LLM_EVERY": "every",
    "ADMIT_LLM_CALLS_PER_MIN": "calls_per_min",
    "ADMIT_LLM_TIMEOUT_S": "timeout_s",
    "ADMIT_LLM_LOG": "log_path",
    "ADMIT_LLM_PROMPT": "prompt_file",
}


def _coerce(cfg: LLMConfig, values: Mapping[str, Any], origin: str) -> LLMConfig:
    """``cfg`` with ``values`` laid over it, each converted to its field's type first (environment variables
    are strings; ``every: 2.5`` keeps meaning 2), then the whole checked by the schema."""
    types = {name: f.annotation for name, f in LLMConfig.model_fields.items()}
    out: dict[str, Any] = {}
    for key, raw in values.items():
        if key not in types:
            raise ConfigError(f"llm settings ({origin}): unknown key {key!r}; allowed: {', '.join(sorted(types))}")
        kind = _KINDS[types[key]]
        try:
            out[key] = kind(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"llm settings ({origin}): {key} must be {kind.__name__}, got {raw!r}") from None
    try:
        return LLMConfig.model_validate({**cfg.model_dump(), **out})
    except ValidationError as exc:
        raise ConfigError(f"llm settings ({origin}): {'; '.join(error_lines(exc))}") from None


def load_config(arg: str | None = None, env: Mapping[str, str] | None = None) -> LLMConfig:
    """Build the settings from defaults, ``ADMIT_LLM_CONFIG``/YAML, environment and the policy argument."""
    env = os.environ if env is None else env
    cfg = LLMConfig()
    is_file = arg is not None and arg.endswith((".yaml", ".yml"))
    for path in (env.get("ADMIT_LLM_CONFIG"), arg if is_file else None):
        if path:
            data = yaml.safe_load(Path(path).read_text()) or {}
            if not isinstance(data, dict):
                raise ConfigError(f"llm settings ({path}): expected a mapping of keys to values")
            cfg = _coerce(cfg, data, path)
    cfg = _coerce(cfg, {v: env[k] for k, v in _ENV.items() if env.get(k)}, "environment")
    if arg and not is_file:
        cfg = _coerce(cfg, {"base_url": arg}, "policy argument")
    return cfg

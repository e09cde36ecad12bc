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
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml
from admit.core.config import ConfigError

LOCAL_API_KEY = "sk-local"  # llama.cpp and vLLM accept any key when started without one


@dataclass(frozen=True)
class LLMConfig:
    base_url: str = "http://127.0.0.1:8080/v1"
    model: str = "local"
    api_key: str = ""
    timeout_s: float = 10.0
    max_tokens: int = 200
    temperature: float = 0.0
    every: int = 1
    calls_per_min: float = 120.0
    burst: int = 5
    history: int = 8
    cache_size: int = 256
    log_path: str = ""
    log_keep: int = 1000
    prompt_file: str = ""

    def __post_init__(self) -> None:
        checks = {
            "timeout_s": self.timeout_s > 0,
            "max_tokens": self.max_tokens >= 16,
            "temperature": self.temperature >= 0,
            "every": self.every >= 1,
            "calls_per_min": self.calls_per_min > 0,
            "burst": self.burst >= 1,
            "history": self.history >= 2,
            "cache_size": self.cache_size >= 0,
            "log_keep": self.log_keep >= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"llm settings: invalid value for {bad[0]}={getattr(self, bad[0])!r}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"llm settings: base_url must start with http:// or https://, got {self.base_url!r}")

    def resolved_api_key(self) -> str:
        return self.api_key or os.environ.get("OPENAI_API_KEY", "") or LOCAL_API_KEY


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
    types = {f.name: f.type for f in fields(LLMConfig)}
    out: dict[str, Any] = {}
    for key, raw in values.items():
        if key not in types:
            raise ConfigError(f"llm settings ({origin}): unknown key {key!r}; allowed: {', '.join(sorted(types))}")
        kind = {"str": str, "int": int, "float": float}[str(types[key])]
        try:
            out[key] = kind(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"llm settings ({origin}): {key} must be {kind.__name__}, got {raw!r}") from None
    return replace(cfg, **out)


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

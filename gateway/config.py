"""The gateway's configuration file (tenants.yaml): a typed schema with errors that name the key.

Example::

    auth: {mode: api_key}              # or {mode: trusted_header, header: x-admit-tenant}
    admin: {token_env: ADMIT_ADMIN_TOKEN}
    capacity: 32                       # optional: total in flight at the backend, shared work-conservingly
    max_body_bytes: 1048576
    request_log: gateway-requests.jsonl
    audit_log: gateway-audit.jsonl
    # redis: {url: "redis://127.0.0.1:6379/0", failure_mode: closed}   # instead of capacity: shared by replicas
    tenants:
      - name: chat
        api_keys: [sk-chat-1]          # or api_keys_env: CHAT_KEYS (keys comma-separated, e.g. from a Secret)
        limit: 8
        max_limit: 16                  # optional ceiling at run time (admin API, control loop; gateway/kueue.py)
        min_limit: 4                   # optional floor at run time, a guaranteed share (same; gateway/kueue.py)
        max_queue: 64
        queue_timeout_s: 5             # formerly queue_ttl_s (still read, with a deprecation warning)
        priority: 1
        slo: {e2e_p99_s: 12}           # the objectives the Observation carries (core/slo.py)
        borrow: 8                      # may use up to 8 idle slots of others (needs capacity)
        envelopes:
          - {target: "*", requests_per_s: 20, request_burst: 40, tokens_per_s: 20000, token_burst: 60000}

Secrets (API keys, the admin token) are held as given but never written to a log; the admin token is best
passed through an environment variable (``token_env``).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from admit.core import config as core_config
from admit.core.config import renamed_keys
from admit.core.contract import Contract
from admit.core.schema import StrictModel
from admit.core.slo import SLO
from pydantic import Field, ValidationError, field_validator, model_validator

ENVELOPE_TARGET_ANY = "*"


class ConfigError(core_config.ConfigError):
    """A configuration file that cannot be used; the message names the key and what is allowed."""


# The documented range of every envelope value (docs/gateway.md). The bounds keep the GCRA arithmetic finite
# in Python and in Redis's Lua (the emission interval 1/rate and the window burst/rate are both bounded):
# the slowest envelope is one request every ~2.8 hours, the fastest a million requests or a billion tokens
# a second.
REQUESTS_PER_S = (1e-4, 1e6)
TOKENS_PER_S = (1e-3, 1e9)
REQUEST_BURST_MAX = 1_000_000
LIMIT_MAX = 1_000_000  # a tenant's concurrency limit, queue and borrow (also what the admin API accepts)
TOKEN_BURST_MAX = 1_000_000_000
# configuration versions (the gateway's and each tenant's): well inside a Lua number's exact integers, so that
# Redis's scripts count them exactly too
VERSION_MAX = 10**15 - 1
# an envelope's target: "*" or a model name as the OpenAI API and vLLM use them (meta-llama/Llama-3-8B,
# ft:gpt-4o:org:id, llama3.1:8b, a local path); no whitespace, no control character, nothing that would need
# escaping in a log line or a URL
ENVELOPE_TARGET_CHARS = "letters, digits and . _ - : / @ + = ~"
_TARGET = re.compile(r"[A-Za-z0-9._:/@+=~-]+")


def check_count(v: Any, what: str, high: int = LIMIT_MAX) -> int:
    """``v`` when it is an integer between 0 and ``high`` (a limit, a borrow, a version), else ValueError saying
    what ``what`` must be. Numbers only: no bool, no float (not even 2.0), no string. The one check of such a
    value wherever it comes from: the admin API, the state file (gateway/state.py), Redis (``parse_count``)."""
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= high:
        raise ValueError(f"{what} must be an integer between 0 and {high}, got {_shown(v)}")
    return v


def parse_count(raw: str, what: str, high: int = LIMIT_MAX) -> int:
    """``check_count`` for a value stored as text (Redis): decimal digits only, so "nan", "1e400", "-3", "2.5"
    and "abc" are refused (ValueError), never turned into a number."""
    if not (0 < len(raw) <= 16 and raw.isascii() and raw.isdigit()):
        raise ValueError(f"{what} must be an integer between 0 and {high}, got {_shown(raw)}")
    return check_count(int(raw), what, high)


def _shown(v: Any) -> str:
    """A value as an error message quotes it: repr (control characters escaped), at most 100 characters."""
    text = repr(v)
    return text if len(text) <= 100 else text[:97] + "..."


class EnvelopeConfig(StrictModel):
    """A rate envelope of one tenant towards one target (a model name, or ``*`` for every model). The target
    is checked here for every source alike (the configuration file, the admin API, Redis): ``*`` or
    ENVELOPE_TARGET_CHARS only.

    Requests and tokens are each limited by a GCRA bucket: ``*_per_s`` is the sustained rate and
    ``*_burst`` how many units may be spent at once. Leave a pair out to not limit that unit.
    """

    target: str = Field(default=ENVELOPE_TARGET_ANY, min_length=1, max_length=256)
    # strict: numbers only (no true, no "5"), so that what the admin API takes is what was meant
    requests_per_s: float | None = Field(default=None, ge=REQUESTS_PER_S[0], le=REQUESTS_PER_S[1], strict=True)
    request_burst: int | None = Field(default=None, ge=1, le=REQUEST_BURST_MAX, strict=True)
    tokens_per_s: float | None = Field(default=None, ge=TOKENS_PER_S[0], le=TOKENS_PER_S[1], strict=True)
    token_burst: int | None = Field(default=None, ge=1, le=TOKEN_BURST_MAX, strict=True)
    alert_below: float = Field(default=0.2, ge=0, le=1, strict=True)

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        if v != ENVELOPE_TARGET_ANY and not _TARGET.fullmatch(v):
            raise ValueError(f"a target is \"*\" or a model name of {ENVELOPE_TARGET_CHARS} (at most 256), "
                             f"got {_shown(v)}")
        return v

    @model_validator(mode="after")
    def _pairs(self) -> EnvelopeConfig:
        if self.requests_per_s is None and self.tokens_per_s is None:
            raise ValueError("an envelope needs requests_per_s or tokens_per_s (or both)")
        if self.request_burst is not None and self.requests_per_s is None:
            raise ValueError("request_burst needs requests_per_s")
        if self.token_burst is not None and self.tokens_per_s is None:
            raise ValueError("token_burst needs tokens_per_s")
        return self

    @property
    def request_burst_or_default(self) -> int:
        return self.request_burst if self.request_burst is not None else max(1, math.ceil(self.requests_per_s or 1))

    @property
    def token_burst_or_default(self) -> int:
        return self.token_burst if self.token_burst is not None else max(1, math.ceil(self.tokens_per_s or 1))


# old tenant keys -> their names in the vocabulary the scenario and the load generator share (docs/gateway.md)
RENAMED_TENANT_KEYS = {
    "queue_ttl_s": "queue_timeout_s",
    "slo_e2e_p99_s": "slo.e2e_p99_s",
    "slo_ttft_p99_s": "slo.ttft_p99_s",
}


class TenantConfig(StrictModel):
    """One tenant as the gateway admits it: its API keys, concurrency limit, queue, borrowing, rate envelopes
    and the objectives the control loop's Observation carries."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    api_keys: tuple[str, ...] = ()
    # an environment variable holding the tenant's API keys, comma-separated (a Kubernetes Secret's value), so
    # that no key sits in the file; read when the configuration is loaded and added to api_keys
    api_keys_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    limit: int = Field(default=4, ge=0, le=LIMIT_MAX)
    # a ceiling no one may set the limit above at run time, neither the admin API nor the control loop (what
    # Kueue admitted for this tenant: gateway/kueue.py); none: only control.max_limit bounds the loop
    max_limit: int | None = Field(default=None, ge=0, le=LIMIT_MAX)
    # a floor no one may set the limit below at run time: the tenant's guaranteed share (Kueue's nominalQuota:
    # gateway/kueue.py); none: only control.min_limit bounds the loop
    min_limit: int | None = Field(default=None, ge=0, le=LIMIT_MAX)
    max_queue: int = Field(default=64, ge=0, le=LIMIT_MAX)
    queue_timeout_s: float = Field(default=30.0, gt=0, le=86_400)
    priority: int = Field(default=0, ge=-1000, le=1000)
    weight: float = Field(default=1.0, gt=0, le=1e6)
    borrow: int = Field(default=0, ge=0, le=LIMIT_MAX)
    envelopes: tuple[EnvelopeConfig, ...] = ()
    slo: SLO = SLO()  # objectives the Observation carries (none = NO_SLO)
    # the load the tenant is promised service for (core/contract.py): each request is classified in or out of
    # contract at its arrival, as the simulator classifies it; with redis on one envelope for all replicas
    # (gateway/redis/contracts.py)
    contract: Contract | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        where = f"tenant {data.get('name')!r}" if isinstance(data, dict) else "tenant"
        return renamed_keys(data, RENAMED_TENANT_KEYS, where, "see docs/gateway.md")

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for k in v:
            if len(k) < 8:
                raise ValueError("every API key needs at least 8 characters")
        return v

    @model_validator(mode="after")
    def _bounds_and_keys(self) -> TenantConfig:
        if self.max_limit is not None and self.limit > self.max_limit:
            raise ValueError(f"tenant {self.name!r}: limit {self.limit} is above its max_limit {self.max_limit}")
        if self.min_limit is not None and self.limit < self.min_limit:
            raise ValueError(f"tenant {self.name!r}: limit {self.limit} is below its min_limit {self.min_limit}")
        if self.api_keys_env is not None:
            value = os.environ.get(self.api_keys_env)
            if value is None:
                raise ValueError(f"tenant {self.name!r}: api_keys_env: environment variable {self.api_keys_env} "
                                 "is not set")
            keys = tuple(k.strip() for k in value.split(",") if k.strip())
            if not keys:
                raise ValueError(f"tenant {self.name!r}: api_keys_env: {self.api_keys_env} holds no key "
                                 "(expected keys separated by commas)")
            short = sum(len(k) < 8 for k in keys)
            if short:  # the keys themselves are never part of a message
                raise ValueError(f"tenant {self.name!r}: api_keys_env: {short} key(s) in {self.api_keys_env} are "
                                 "shorter than 8 "
                                 "characters")
            object.__setattr__(self, "api_keys", tuple(dict.fromkeys((*self.api_keys, *keys))))
        return self

    @field_validator("envelopes")
    @classmethod
    def _targets(cls, v: tuple[EnvelopeConfig, ...]) -> tuple[EnvelopeConfig, ...]:
        seen = [e.target for e in v]
        dup = {t for t in seen if seen.count(t) > 1}
        if dup:
            raise ValueError(f"envelope target(s) listed twice: {', '.join(sorted(dup))}")
        return v


class AuthConfig(StrictModel):
    mode: Literal["api_key", "trusted_header"] = "api_key"
    header: str = Field(default="x-admit-tenant", min_length=1)


class _TokenConfig(StrictModel):
    """A bearer token given inline (``token``) or, better, in an environment variable (``token_env``)."""

    token: str | None = Field(default=None, min_length=16)
    token_env: str | None = None
    _key: ClassVar[str] = "token"  # the section's key, for the error messages

    def resolve(self) -> str | None:
        if self.token_env:
            value = os.environ.get(self.token_env)
            if not value:
                raise ConfigError(f"{self._key}.token_env: environment variable {self.token_env} is not set")
            if len(value) < 16:
                raise ConfigError(f"{self._key}.token_env: the token in {self.token_env} needs at least 16 characters")
            return value
        return self.token


class AdminConfig(_TokenConfig):
    _key: ClassVar[str] = "admin"


class RedisConfig(StrictModel):
    """State shared by several gateway replicas: leases, limits and rate envelopes (gateway/redis/admission.py,
    gateway/redis/envelopes.py, docs/gateway.md). ``failure_mode`` applies to the leases and the envelopes."""

    url: str = Field(default="redis://127.0.0.1:6379/0", pattern=r"^(redis|rediss|unix)://")
    prefix: str = Field(default="admit", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    failure_mode: Literal["open", "closed"] = "closed"
    lease_ttl_s: float = Field(default=30.0, ge=1)
    timeout_s: float = Field(default=0.5, gt=0)
    poll_s: float = Field(default=0.05, gt=0)
    retry_after_s: float = Field(default=1.0, ge=0)


class TelemetryConfig(StrictModel):
    """Where the Observation's engine gauges come from and when they count as stale (gateway/telemetry.py)."""

    metrics_url: str | None = Field(default=None, pattern=r"^https?://")  # default: the backend's /metrics
    scrape_interval_s: float = Field(default=1.0, gt=0)
    stale_after_s: float = Field(default=5.0, gt=0)
    stale_waiting: float = Field(default=64.0, ge=0)  # engine_waiting reported while stale (saturated)
    window_s: float = Field(default=6.0, gt=0)
    nvml: bool = True


class ConnectionsConfig(StrictModel):
    """Bounds on every client connection, enforced below the ASGI app (gateway/guard.py, docs/gateway.md).

    ``max_connections`` (default: from the process's open-file limit, leaving room for the backend pool,
    Redis and logs) caps open client connections; past it an idle connection, else the slowest request
    head, is closed to make room (gateway/guard.py says which), and only when none may be is the new one
    answered 503 ``too-many-connections``. ``write_timeout_s`` bounds a client that stops reading its answers:
    once more is queued for it than the transport buffers, it must take some of it within that time;
    ``send_buffer_bytes`` fixes the kernel's share of what is queued.
    """

    max_connections: int | None = Field(default=None, ge=1, le=1_000_000)
    max_head_bytes: int = Field(default=32 * 1024, ge=1024, le=1 << 20)  # request line + headers: 431 past it
    head_timeout_s: float = Field(default=10.0, gt=0, le=3600)  # first byte of a head -> its end: 408 past it
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)  # end of the head -> end of the body: 408
    idle_timeout_s: float = Field(default=30.0, gt=0, le=3600)  # a connection with no request in progress
    # a client that takes none of the bytes the gateway has queued for it for this long is cut (TCP reset)
    write_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # the kernel's send buffer of each client connection (SO_SNDBUF); null = the kernel sizes and grows it
    # (net.ipv4.tcp_wmem, up to 4 MB by default). A number fixes it: what the kernel holds for a client that
    # reads slowly or not at all stays bounded, and can no longer grow to take a closed connection's last
    # bytes (nginx's ``listen ... sndbuf=``). Linux counts twice the value, bookkeeping included.
    send_buffer_bytes: int | None = Field(default=None, ge=4096, le=64 << 20)


class MetricsConfig(_TokenConfig):
    """Who may read ``GET /metrics``. Default: anyone who can reach the port (what Prometheus scrapers
    expect; bind the gateway to a private address). With a token, a scrape needs ``Authorization: Bearer``
    with it (or with the admin token)."""

    _key: ClassVar[str] = "metrics"


class ControlConfig(StrictModel):
    """Bounds a control loop started with ``--spec gateway`` uses (its ControlSpec's Limits and interval)."""

    min_limit: int = Field(default=1, ge=0)
    max_limit: int = Field(default=64, ge=1)
    max_step: int = Field(default=1, ge=1)
    interval_s: float = Field(default=3.0, gt=0)


class GatewayConfig(StrictModel):
    auth: AuthConfig = AuthConfig()
    admin: AdminConfig = AdminConfig()
    capacity: int | None = Field(default=None, ge=1)
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    # the backend's context length (tokens of prompt + output of one sequence), which bounds what a request that
    # names no output limit may cost; default: what the backend's GET /v1/models reports (gateway/app.py)
    max_model_len: int | None = Field(default=None, ge=1, le=100_000_000)
    # the output tokens per choice a chat request that names no output limit is charged up front while the context
    # length is unknown; every charge is settled with what the backend delivered when the request ends
    default_output_tokens: int = Field(default=256, ge=1, le=1_000_000)
    backend_timeout_s: float = Field(default=600.0, gt=0)
    no_backend_retry_after_s: float = Field(default=1.0, ge=0)
    # Retry-After when the backend's own admission answers 503 (vLLM --max-num-queued-reqs): `backend-busy`
    backend_busy_retry_after_s: float = Field(default=1.0, ge=0)
    request_log: Path | None = None
    # lines a second (burst 10x) for requests that name no tenant (401s, 404s); the rest are counted only
    unauthenticated_log_per_s: float = Field(default=10.0, ge=0, le=1e6)
    # process-log (stderr) lines a second of one kind, burst 10x, uvicorn's included (gateway/logs.py); 0 = no limit
    log_lines_per_s: float = Field(default=5.0, ge=0, le=1e6)
    audit_log: Path | None = None
    # limits, borrow and envelopes set at run time survive a restart of an in-process gateway (gateway/state.py)
    state_file: Path | None = None
    redis: RedisConfig | None = None
    connections: ConnectionsConfig = ConnectionsConfig()
    metrics: MetricsConfig = MetricsConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    control: ControlConfig = ControlConfig()
    tenants: tuple[TenantConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        names = [t.name for t in self.tenants]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"tenant name(s) listed twice: {', '.join(sorted(dup))}")
        keys = [k for t in self.tenants for k in t.api_keys]
        if len(keys) != len(set(keys)):
            raise ValueError("an API key is given to more than one tenant")
        if self.auth.mode == "api_key":
            missing = [t.name for t in self.tenants if not t.api_keys]
            if missing:
                raise ValueError(f"auth.mode api_key: tenant(s) without api_keys: {', '.join(missing)}")
        if self.capacity is None and any(t.borrow for t in self.tenants):
            raise ValueError("borrow needs a global 'capacity' to borrow from")
        if self.redis is not None and self.capacity is not None:
            raise ValueError("capacity (work-conserving sharing) is in-process only; it cannot be used with redis")
        if self.redis is not None and self.state_file is not None:
            raise ValueError("state_file is for an in-process gateway; with redis the run-time state lives in Redis")
        return self

    def key_index(self) -> dict[bytes, int]:
        """SHA-256 of every API key -> tenant index (lookups hash the presented key, so timing reveals nothing)."""
        return {hashlib.sha256(k.encode()).digest(): i for i, t in enumerate(self.tenants) for k in t.api_keys}


def _explain(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            parent = e["loc"][:-1]
            model: Any = GatewayConfig
            for part in parent:
                if isinstance(part, int):
                    continue
                ann = model.model_fields[str(part)].annotation
                model = next((a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type)), ann)
                if hasattr(model, "__args__"):
                    model = model.__args__[0]
            allowed = ", ".join(getattr(model, "model_fields", {}))
            msg = f"unknown key; allowed keys: {allowed}"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"{key}: {msg}")
    return f"{source}: invalid gateway configuration\n  " + "\n  ".join(lines)


def parse_config(data: Any, source: str = "config") -> GatewayConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with a 'tenants' list")
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_explain(err, source)) from None
    cfg.admin.resolve()
    cfg.metrics.resolve()
    return cfg


def read_config_data(path: str | Path) -> Any:
    """The YAML of a configuration file as read, before any check; ConfigError when it is missing or not YAML."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from None


def load_config(path: str | Path) -> GatewayConfig:
    return parse_config(read_config_data(path), str(path))

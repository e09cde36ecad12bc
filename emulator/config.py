"""The emulator's settings and the token engine they build.

``max_model_len`` defaults to the preset's; like vLLM, start-up fails when one request of that length
could not fit in the KV cache (lower ``--max-model-len`` or raise ``--num-gpu-blocks``).

Output lengths without ``ignore_eos``: the request "stops" after a length drawn from a lognormal
distribution (median ``output_median`` tokens, log-space sigma ``output_sigma``), or at ``max_tokens``
if that comes first. The defaults (median 200, sigma 0.8) are an assumption of chat-like answers, not
a fit to a trace; pass ``ignore_eos`` to get exactly ``max_tokens``.

``admin_token``: when set, ``/admin/faults`` and ``/debug/requests`` need ``Authorization: Bearer <token>``
(at least 16 visible ASCII characters, as the gateway's admin token); without it they are open only while
the emulator listens on loopback addresses alone (emulator/server.py says why).

``head_timeout_s``: a request head must end within this many seconds of its first byte (emulator/http.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from admit.core.config import ConfigError
from admit.emulator.http import HEAD_TIMEOUT_S
from admit.engine.presets import Preset, get_preset
from admit.engine.token_engine import TokenEngine

MIN_TOKEN_LEN = 16  # as the gateway's admin token (gateway/config.py)
MAX_HEAD_TIMEOUT_S = 3600.0  # as the gateway's connection deadlines


@dataclass(frozen=True)
class EmulatorConfig:
    preset: str = "h200-llama3-8b"
    host: str = "127.0.0.1"
    port: int = 8000
    model: str | None = None
    max_model_len: int | None = None
    seed: int = 0
    num_gpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    output_median: float = 200.0
    output_sigma: float = 0.8
    startup_delay_s: float = 0.0
    latency_multiplier: float = 1.0
    head_timeout_s: float = HEAD_TIMEOUT_S
    admin_token: str | None = field(default=None, repr=False)  # never printed with the settings

    def __post_init__(self) -> None:
        get_preset(self.preset)  # a clear error naming the allowed presets
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        for name in ("max_model_len", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{name} must be >= 1, got {v}")
        if not (math.isfinite(self.output_median) and self.output_median >= 1):
            raise ConfigError(f"output_median must be >= 1, got {self.output_median}")
        if not (math.isfinite(self.output_sigma) and self.output_sigma >= 0):
            raise ConfigError(f"output_sigma must be >= 0, got {self.output_sigma}")
        if not (math.isfinite(self.startup_delay_s) and self.startup_delay_s >= 0):
            raise ConfigError(f"startup_delay_s must be >= 0, got {self.startup_delay_s}")
        if not (math.isfinite(self.latency_multiplier) and self.latency_multiplier > 0):
            raise ConfigError(f"latency_multiplier must be > 0, got {self.latency_multiplier}")
        if not (math.isfinite(self.head_timeout_s) and 0 < self.head_timeout_s <= MAX_HEAD_TIMEOUT_S):
            raise ConfigError(f"head_timeout_s must be > 0 and <= {MAX_HEAD_TIMEOUT_S:g} seconds, "
                              f"got {self.head_timeout_s}")
        if self.admin_token is not None:  # the message never contains the token
            if len(self.admin_token) < MIN_TOKEN_LEN:
                raise ConfigError(f"the admin token needs at least {MIN_TOKEN_LEN} characters, "
                                 f"got {len(self.admin_token)}")
            if not all("!" <= c <= "~" for c in self.admin_token):
                raise ConfigError("the admin token must be visible ASCII characters (no spaces), "
                                 "as it travels in an HTTP header")

    def preset_obj(self) -> Preset:
        p = get_preset(self.preset)
        if self.max_model_len is not None:
            p = dataclasses.replace(p, max_model_len=self.max_model_len)
        return p

    def served_model(self) -> str:
        """The name clients must send: ``--model``, else the preset's model id without its annotations."""
        return self.model or self.preset_obj().model.split(" (")[0]

    def build_engine(self) -> TokenEngine:
        p = self.preset_obj()
        engine = TokenEngine(
            p,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            num_gpu_blocks=self.num_gpu_blocks,
        )
        capacity = engine.num_gpu_blocks * engine.block_size
        if p.max_model_len > capacity:
            raise ConfigError(
                f"max_model_len {p.max_model_len} is more than the KV cache holds ({engine.num_gpu_blocks} blocks "
                f"of {engine.block_size} = {capacity} tokens); lower --max-model-len or raise --num-gpu-blocks"
            )
        return engine

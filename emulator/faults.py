"""Injected faults: the knobs of ``POST /admin/faults``, validated, with their current values.

* ``latency_multiplier`` (> 0, default 1): every engine step takes this many times as long on the wall
  clock (the engine's clock runs slower, :mod:`admit.emulator.clock`); < 1 speeds the engine up.
* ``error_rate`` (0..1, default 0): this fraction of new generation requests is answered at once with
  ``error_status`` (500 or 503, default 503) and an OpenAI-style error body; the draw is seeded.
* ``paused`` (bool): the engine's clock stops; streams stall, new requests queue; resuming continues
  where it stopped.
* ``startup_delay_s`` (>= 0): the server reports not ready (``/health`` and generation answer 503) for
  this many seconds from the moment it is set (or from start-up, on the command line).

A POST changes only the keys it names; an unknown key or a bad value is a 400 naming the key and what
is allowed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from admit.core.config import ConfigError

ERROR_STATUSES = (500, 503)


class FaultError(ConfigError):
    """A bad fault setting; ``param`` names the key."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class Faults:
    latency_multiplier: float = 1.0
    error_rate: float = 0.0
    error_status: int = 503
    paused: bool = False
    startup_delay_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validated_update(self, body: Any) -> dict[str, Any]:
        """Check a POST body against the knobs; return the new values (nothing is changed here)."""
        if not isinstance(body, dict):
            raise FaultError("the body must be a JSON object of fault settings", None)
        allowed = list(self.as_dict())
        out: dict[str, Any] = {}
        for key, v in body.items():
            if key not in allowed:
                raise FaultError(f"unknown fault setting {key!r}; allowed: {allowed}", key)
            if key == "paused":
                if not isinstance(v, bool):
                    raise FaultError(f"paused must be true or false, got {v!r}", key)
            elif key == "error_status":
                if isinstance(v, bool) or v not in ERROR_STATUSES:
                    raise FaultError(f"error_status must be one of {list(ERROR_STATUSES)}, got {v!r}", key)
            else:
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                    raise FaultError(f"{key} must be a finite number, got {v!r}", key)
                v = float(v)
                if key == "latency_multiplier" and v <= 0:
                    raise FaultError(f"latency_multiplier must be > 0, got {v}", key)
                if key == "error_rate" and not 0.0 <= v <= 1.0:
                    raise FaultError(f"error_rate must be in [0, 1], got {v}", key)
                if key == "startup_delay_s" and v < 0:
                    raise FaultError(f"startup_delay_s must be >= 0, got {v}", key)
            out[key] = v
        return out

"""Run-time state of an in-process gateway kept across restarts (``state_file:`` in tenants.yaml).

Limits, borrow and rate envelopes changed at run time (the admin API, the control loop through it) live in
the gateway's memory; without this file a gateway restarted after a crash would start again from its
configuration file and forget them. With ``state_file`` set, every change the admin API makes rewrites the
file (a temporary file renamed over it: a crash leaves the old state or the new one, never half of either),
and start-up applies what it holds over the configuration.

What it keeps: per tenant the nominal limit, the borrow, the full list of envelope *configs* and the tenant's
version, plus the configuration version (gateway/admission.py; a file written before tenant versions were
kept still loads, its tenants at version 0). What it does not: bucket levels (a restarted gateway's
envelopes start full, as after a configuration change that adds them), queues and requests in flight (they
died with the process).
A tenant the file names that the configuration no longer has is skipped with a warning; a tenant the file
does not name keeps its configured values. A file that cannot be read or does not have this shape stops
start-up with an error naming the file and the key: deleting it is the explicit way to start afresh.

With Redis the state lives in Redis (gateway/redis/admission.py), which replicas share; ``state_file`` is
refused there.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from admit.gateway.config import LIMIT_MAX, VERSION_MAX, ConfigError, EnvelopeConfig, check_count
from pydantic import ValidationError

FORMAT = 1


@dataclass
class SavedState:
    version: int = 0
    limits: dict[str, int] = field(default_factory=dict)
    borrow: dict[str, int] = field(default_factory=dict)
    envelopes: dict[str, list[EnvelopeConfig]] = field(default_factory=dict)
    tenant_versions: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "tenant_versions": self.tenant_versions,
            "limits": self.limits,
            "borrow": self.borrow,
            "envelopes": {t: [e.model_dump() for e in envs] for t, envs in self.envelopes.items()},
        }


def _counts(data: dict[str, Any], key: str, high: int = LIMIT_MAX) -> dict[str, int]:
    got = data.get(key, {})
    if not isinstance(got, dict):
        raise ValueError(f"{key}: expected an object of tenant name -> integer")
    return {str(t): check_count(v, f"{key}.{t}", high) for t, v in got.items()}


def load_state(path: Path) -> SavedState | None:
    """The state in ``path``, or None when there is no file yet. Raises ConfigError naming what is wrong."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a gateway state file of format {FORMAT} (a JSON object with \"format\": {FORMAT})")
        state = SavedState(version=check_count(data.get("version", 0), "version", VERSION_MAX),
                           limits=_counts(data, "limits"), borrow=_counts(data, "borrow"),
                           tenant_versions=_counts(data, "tenant_versions", VERSION_MAX))
        envs = data.get("envelopes", {})
        if not isinstance(envs, dict):
            raise ValueError("envelopes: expected an object of tenant name -> list of envelopes")
        for tenant, items in envs.items():
            if not isinstance(items, list):
                raise ValueError(f"envelopes.{tenant}: expected a list of envelopes")
            state.envelopes[str(tenant)] = [EnvelopeConfig.model_validate(e) for e in items]
    except (OSError, ValueError, ValidationError) as exc:  # JSONDecodeError and ValidationError are ValueErrors
        raise ConfigError(f"state file {path}: {exc} (delete it to start from the configuration file)") from None
    return state


def save_state(path: Path, state: SavedState) -> None:
    """Write ``state`` to ``path`` atomically (a temporary file in the same folder, renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state.to_json(), fh, separators=(",", ":"), sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

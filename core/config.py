"""What every configuration of admit shares: one error type for a bad one, and the way old key names live on.

Every loader raises a subclass of :class:`ConfigError` — ``ScenarioError`` (scenario files),
``admit.gateway.config.ConfigError`` (the gateway's tenants.yaml), ``admit.loadgen.config.ConfigError`` (the
load generator's run files and flags), ``TrainConfigError`` (training configs), ``FaultError`` (the
emulator's fault knobs) — and the emulator's and the LLM policy's settings raise it directly. A caller that
only asks "was it the configuration?" catches this one type; each subclass keeps its name and import path
for the callers (and tests) that catch it by that name. It is a ``ValueError``, as every one of them was.

A key that was renamed keeps working for a while: :func:`renamed_keys` reads the old name as the new one
and warns with :class:`DeprecatedKeyWarning`, which Python prints by default (a ``FutureWarning``: it is
meant for whoever wrote the file, not only for developers).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    """A configuration (a file, a flag or an API body) that cannot be used; the message names the key and
    what is allowed."""


class DeprecatedKeyWarning(FutureWarning):
    """A configuration used a key's old name; it was read as the new one (the message names both)."""


def renamed_keys(data: Any, renames: Mapping[str, str], where: str, doc: str) -> Any:
    """``data`` with every old key of ``renames`` moved to its new name, one warning per old key found.

    A new name may be dotted (``slo.e2e_p99_s``): the value goes into that nested mapping, so a flat old key
    can become a field of a nested one. Giving both names of one key is an error: which one was meant is
    unknowable. Anything but a mapping is returned as it is (the schema then says what is wrong with it).
    """
    if not isinstance(data, Mapping) or not any(old in data for old in renames):
        return data
    out = dict(data)
    for old, new in renames.items():
        if old not in out:
            continue
        value = out.pop(old)
        *parents, leaf = new.split(".")
        node = out
        for p in parents:
            child = node.get(p)
            if child is None:
                child = {}
            elif not isinstance(child, Mapping):
                raise ConfigError(f"{where}: {old!r} is the old name of {new!r}, but {p!r} is not a mapping")
            node[p] = child = dict(child)
            node = child
        if leaf in node:
            raise ConfigError(f"{where}: both {old!r} and its new name {new!r} are given; keep only {new!r}")
        node[leaf] = value
        warnings.warn(
            f"{where}: {old!r} is deprecated; write {new!r} (it is read as {new!r} until it is removed; {doc})",
            DeprecatedKeyWarning,
            stacklevel=2,
        )
    return out


def error_lines(err: Any) -> list[str]:
    """``key: message`` for every error of a pydantic ``ValidationError``, the key dotted from the top of what
    was validated (``tenants.0.slo.e2e_p99_s``); a key the schema does not have reads ``unknown key``."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"{loc or '(top level)'}: {msg}")
    return lines

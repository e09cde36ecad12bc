"""Trace readers: a recorded arrival sequence with its token counts, replayed open-loop.

Two formats are read:

* the Azure LLM inference trace 2023 CSV, columns ``TIMESTAMP,ContextTokens,GeneratedTokens`` where
  ``TIMESTAMP`` is a date-time string (e.g. ``2023-11-16 18:15:46.6805900``) or a number of seconds (the other
  column names core/traces.py knows are read too: it is the simulator's reader as well, so both replay the
  same requests);
* a JSON-lines request log with one object per request and the keys ``tenant``, ``arrival`` (seconds,
  absolute or relative), ``prompt_tokens`` and ``output_tokens``.

Replay shifts the first arrival to offset 0, divides the gaps by ``speedup`` and keeps arrivals within
the stage duration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from admit.core import traces
from admit.loadgen.arrivals import NS

JSONL_KEYS = ("tenant", "arrival", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class Trace:
    """Arrival offsets (seconds from the first request) and token counts, sorted by arrival."""

    arrivals: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def window(self, duration_s: float, speedup: float = 1.0) -> Trace:
        """The part that falls within ``duration_s`` after dividing every offset by ``speedup``."""
        if not speedup > 0:
            raise ValueError(f"trace speedup must be > 0, got {speedup}")
        t = self.arrivals / speedup
        keep = t < duration_s
        return Trace(t[keep], self.prompt_tokens[keep], self.output_tokens[keep])

    def offsets_ns(self) -> np.ndarray:
        return np.floor(self.arrivals * NS).astype(np.int64)


def read_azure_csv(path: str | Path) -> Trace:
    """Read an Azure 2023 trace CSV (see module docstring)."""
    path = Path(path)
    return Trace(*traces.read_csv(path.read_text(), str(path)))


def read_jsonl(path: str | Path, tenant: str | None = None) -> Trace:
    """Read a JSON-lines request log; with ``tenant`` only that tenant's lines are kept."""
    path = Path(path)
    arr: list[float] = []
    prompt: list[int] = []
    out: list[int] = []
    with path.open() as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line}: not valid JSON ({exc.msg})") from None
            missing = [k for k in JSONL_KEYS if k not in rec]
            if missing:
                need = ", ".join(JSONL_KEYS)
                raise ValueError(f"{path}:{line}: missing key(s) {', '.join(missing)}; each line needs {need}")
            if tenant is not None and str(rec["tenant"]) != tenant:
                continue
            try:
                arr.append(float(rec["arrival"]))
                prompt.append(int(rec["prompt_tokens"]))
                out.append(int(rec["output_tokens"]))
            except (TypeError, ValueError):
                raise ValueError(
                    f"{path}:{line}: arrival must be a number, prompt_tokens/output_tokens integers"
                ) from None
    return Trace(*traces.relative(arr, prompt, out, str(path)))


def read_trace(path: str | Path, tenant: str | None = None) -> Trace:
    """Pick the reader by extension: ``.jsonl``/``.json`` is a request log, anything else an Azure CSV."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"trace file {p} does not exist")
    if p.suffix in (".jsonl", ".json", ".ndjson"):
        return read_jsonl(p, tenant)
    return read_azure_csv(p)

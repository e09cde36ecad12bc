"""Trace readers: a recorded arrival sequence with its token counts, replayed open-loop.

Two formats are read:

* the Azure LLM inference trace 2023 CSV, columns ``TIMESTAMP,ContextTokens,GeneratedTokens`` where
  ``TIMESTAMP`` is a date-time string (e.g. ``2023-11-16 18:15:46.6805900``) or a number of seconds;
* a JSON-lines request log with one object per request and the keys ``tenant``, ``arrival`` (seconds,
  absolute or relative), ``prompt_tokens`` and ``output_tokens``.

Replay shifts the first arrival to offset 0, divides the gaps by ``speedup`` and keeps arrivals within
the stage duration.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from admit.loadgen.arrivals import NS

JSONL_KEYS = ("tenant", "arrival", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


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


def _timestamp(text: str, path: Path, line: int) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    cleaned = text.strip()
    if "." in cleaned:  # Python parses at most 6 fractional digits; the Azure trace has 7
        head, frac = cleaned.split(".", 1)
        cleaned = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(cleaned).timestamp()
    except ValueError:
        raise ValueError(f"{path}:{line}: TIMESTAMP {text!r} is neither seconds nor a date-time") from None


def _build(arr: list[float], prompt: list[int], out: list[int], path: Path) -> Trace:
    if not arr:
        raise ValueError(f"{path}: the trace has no requests")
    a = np.asarray(arr, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    a = a[order] - a[order][0]
    p = np.maximum(np.asarray(prompt, dtype=np.int64)[order], 1)
    o = np.maximum(np.asarray(out, dtype=np.int64)[order], 1)
    return Trace(a, p, o)


def read_azure_csv(path: str | Path) -> Trace:
    """Read an Azure 2023 trace CSV (see module docstring)."""
    path = Path(path)
    arr: list[float] = []
    prompt: list[int] = []
    out: list[int] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(AZURE_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            arr.append(_timestamp(row["TIMESTAMP"], path, line))
            try:
                prompt.append(int(row["ContextTokens"]))
                out.append(int(row["GeneratedTokens"]))
            except ValueError:
                raise ValueError(f"{path}:{line}: ContextTokens and GeneratedTokens must be integers") from None
    return _build(arr, prompt, out, path)


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
    return _build(arr, prompt, out, path)


def read_trace(path: str | Path, tenant: str | None = None) -> Trace:
    """Pick the reader by extension: ``.jsonl``/``.json`` is a request log, anything else an Azure CSV."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"trace file {p} does not exist")
    if p.suffix in (".jsonl", ".json", ".ndjson"):
        return read_jsonl(p, tenant)
    return read_azure_csv(p)

"""Request traces in CSV read once: the Azure LLM inference trace's format, for the simulator's trace replay
(envs/workload.py) and the load generator's (loadgen/traces.py) alike, so both replay the same requests.

A trace CSV has a header and one request a line: a time column, a prompt-token column and an output-token
column, each under any of its names below (the first is the Azure trace's: ``TIMESTAMP,ContextTokens,
GeneratedTokens``). A time is a number of seconds or a date-time (``2023-11-16 18:15:46.6805900``; any form
``datetime.fromisoformat`` reads, with as many fractional digits as given: the Azure trace has 7, one more
than ``datetime`` holds, so the fraction is added to the whole seconds apart; a date-time without a time
zone is local time, which cancels out in the offsets).

The requests come back sorted by time (stable: equal times keep the file's order), as offsets from the first
one, with token counts of at least 1 (a request that generated nothing still asks for one token).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from datetime import datetime

import numpy as np

TIME_COLUMNS = ("TIMESTAMP", "timestamp", "arrival", "arrived_at", "time")
PROMPT_COLUMNS = ("ContextTokens", "prompt_tokens", "num_prefill_tokens", "input_tokens")
OUTPUT_COLUMNS = ("GeneratedTokens", "output_tokens", "num_decode_tokens", "generated_tokens")

_FRACTION = re.compile(r"\.(\d+)")

Requests = tuple[np.ndarray, np.ndarray, np.ndarray]  # arrival offsets (s), prompt tokens, output tokens


def timestamp(text: str) -> float:
    """Seconds (a number, or a date-time's POSIX time with every fractional digit); ValueError otherwise."""
    try:
        return float(text)
    except ValueError:
        pass
    cleaned = text.strip()
    frac = 0.0
    m = _FRACTION.search(cleaned)
    if m is not None:
        cleaned = cleaned[:m.start()] + cleaned[m.end():]
        frac = float("0." + m.group(1))
    return datetime.fromisoformat(cleaned).timestamp() + frac


def relative(times: Sequence[float], prompt: Sequence[int], output: Sequence[int], name: str) -> Requests:
    """The requests sorted by time (stably), as offsets from the first, token counts at least 1."""
    if len(times) == 0:
        raise ValueError(f"trace {name} has no requests")
    t = np.asarray(times, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order][0]
    p = np.maximum(np.asarray(prompt, dtype=np.int64)[order], 1)
    o = np.maximum(np.asarray(output, dtype=np.int64)[order], 1)
    return t, p, o


def _column(options: tuple[str, ...], found: Sequence[str]) -> str | None:
    return next((c for c in options if c in found), None)


def read_csv(text: str, name: str) -> Requests:
    """The requests of a trace CSV's ``text`` (see the module docstring); ``name`` says which in errors."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    found = list(reader.fieldnames or [])
    roles = ((TIME_COLUMNS, "time"), (PROMPT_COLUMNS, "prompt tokens"), (OUTPUT_COLUMNS, "output tokens"))
    cols = [_column(options, found) for options, _ in roles]
    if None in cols:
        missing = [options[0] for (options, _), c in zip(roles, cols, strict=True) if c is None]
        names = "; ".join(f"{what}: {', '.join(options)}" for options, what in roles)
        raise ValueError(f"trace {name}: missing column(s) {', '.join(missing)} (each may go by another name, "
                         f"{names}); found {', '.join(found) or 'no header'}")
    tc, pc, oc = (c for c in cols if c is not None)
    times: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    for line, row in enumerate(reader, start=2):
        try:
            times.append(timestamp(row[tc]))
        except (TypeError, ValueError):
            raise ValueError(f"trace {name}, line {line}: {tc} {row[tc]!r} is neither seconds nor a date-time"
                             ) from None
        try:
            prompt.append(int(row[pc]))
            output.append(int(row[oc]))
        except (TypeError, ValueError):
            raise ValueError(f"trace {name}, line {line}: {pc} and {oc} must be integers, got {row[pc]!r} and "
                             f"{row[oc]!r}") from None
    return relative(times, prompt, output, name)

"""The LLM policy's decision log: one record per decision point, kept in memory and optionally as JSONL.

A record says what the policy did (deltas), where the decision came from (``model``, ``cache`` or
``hold``), why (the model's rationale, or the reason for holding) and how long the call took. The file is
appended to line by line, so a long evaluation can be followed with ``tail -f`` and read with any JSONL
tool; the in-memory copy keeps only the latest records.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Decision:
    step: int  # control interval index since reset
    time_s: float  # observation time
    source: str  # "model", "cache" or "hold"
    reason: str  # "ok" or why the policy held
    deltas: list[int]
    rationale: str
    latency_s: float | None  # wall-clock seconds of the model call, None when no call was made
    prompt_id: str  # short hash of the prompt, groups identical situations


class DecisionLog:
    def __init__(self, path: str | Path | None = None, keep: int = 1000) -> None:
        self.path = Path(path) if path else None
        self.records: deque[Decision] = deque(maxlen=keep)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, record: Decision) -> None:
        self.records.append(record)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(record)) + "\n")


def read_log(path: str | Path) -> list[Decision]:
    """Records of a JSONL decision log, oldest first."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [Decision(**json.loads(line)) for line in lines if line.strip()]

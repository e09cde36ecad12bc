"""Append-only JSON-lines files: the request log and the audit log.

One line per record, written and flushed at once so that a reader (a test, ``admit loadgen`` replaying the
request log as a trace) sees every finished request. Records are built by the gateway from known fields
only; nothing from request headers is copied in except the caller's step id, so no secret reaches a log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

# the request log's keys; the first four are what `admit loadgen` reads as a trace
REQUEST_LOG_KEYS = (
    "tenant",
    "arrival",
    "prompt_tokens",
    "output_tokens",
    "queue_wait_s",
    "ttft_s",
    "e2e_s",
    "backend_ttft_s",
    "overhead_s",
    "outcome",
    "status",
    "model",
    "stream",
    "path",
    "step_id",
    "in_contract",
    "contract_at",
)
AUDIT_KEYS = ("time", "version", "tenant_version", "actor", "what", "tenant", "old", "new", "reason")


class JsonlWriter:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fh: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", buffering=1, encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

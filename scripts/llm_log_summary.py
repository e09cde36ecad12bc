"""Summarise an LLM policy decision log (JSONL written via ADMIT_LLM_LOG): where decisions came from, the
fraction of model calls with a valid reply, hold reasons, call latency and what the model asked for.

    python scripts/llm_log_summary.py results/llm-decisions.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np
from admit.agents.decision_log import read_log
from admit.core.percentiles import linear_np


def summarize(path: str) -> dict[str, object]:
    records = read_log(path)
    calls = [r for r in records if r.latency_s is not None]  # cache hits and budget holds made no call
    valid = [r for r in calls if r.source == "model"]
    lat = np.asarray([r.latency_s for r in calls], dtype=float)
    return {
        "decisions": len(records),
        "by_source": dict(Counter(r.source for r in records)),
        "calls": len(calls),
        "valid_fraction": len(valid) / len(calls) if calls else None,
        "hold_reasons": dict(Counter(r.reason for r in records if r.source == "hold")),
        "latency_s": {  # percentiles.LINEAR
            "mean": float(lat.mean()) if lat.size else None,
            "p50": linear_np(lat, 50) if lat.size else None,
            "p95": linear_np(lat, 95) if lat.size else None,
            "max": float(lat.max()) if lat.size else None,
        },
        "deltas_asked": dict(Counter(str(r.deltas) for r in records if r.source in ("model", "cache"))),
        "rationale_examples": sorted({r.rationale for r in valid})[:5],
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(summarize(sys.argv[1]), indent=2))

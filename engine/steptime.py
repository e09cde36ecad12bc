"""Step-time model of one vLLM engine step, and the hardware/model presets that carry it.

One engine step runs every scheduled token through the model once. Its duration is modelled as

    t = overhead + dense(N) + per_seq·S + kv_read·K + prefill_attn·Q            (seconds)

    N = tokens scheduled in the step (prefill chunk tokens + one per decoding sequence)
    S = sequences scheduled in the step
    K = KV-cache tokens read by the decoding sequences (each reads its whole context, new token included)
    Q = causal (query, key) pairs of the prefill chunks: chunk · (tokens already computed + (chunk + 1) / 2)

    dense(N) = (floor^q + (per_token · N)^q)^(1/q)

``dense`` is the non-attention work (projections, MLP, norms): a smooth roofline, flat at ``floor`` while
reading the weights dominates (memory-bound, small N) and ``per_token`` seconds per token once the
matrix multiplies dominate (compute-bound); ``q`` sets how sharp the knee is. This is the issue's
``c0 + c_p·P + c_d·D + c_kv·ΣL`` made one step better: decode tokens cost dense-layer time too (they
go through the same matrices), and prefill attention grows with the context a chunk attends to.
Where every coefficient comes from is in :mod:`admit.engine.calibration` and docs/fidelity.md.

A decode-only step of ``n`` sequences is ``decode_base(n) + kv_read·K``: linear in K, which is what lets
the token engine jump over many decode steps in closed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class StepTimeModel:
    """Coefficients of the step-time formula in the module docstring (all in seconds)."""

    overhead_s: float
    dense_floor_s: float
    dense_s_per_token: float
    dense_knee: float
    per_seq_s: float
    kv_read_s_per_token: float
    prefill_attn_s_per_pair: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"step-time coefficient {f.name} must be a finite number >= 0, got {v!r}")
        if self.dense_knee < 1:
            raise ValueError(f"step-time coefficient dense_knee must be >= 1, got {self.dense_knee!r}")
        if self.dense_floor_s <= 0 and self.overhead_s <= 0:
            raise ValueError("a step must take time: dense_floor_s or overhead_s must be > 0")

    def dense(self, tokens: float) -> float:
        """Non-attention (dense-layer) time of a step that processes ``tokens`` tokens."""
        q = self.dense_knee
        return (self.dense_floor_s**q + (self.dense_s_per_token * tokens) ** q) ** (1.0 / q)

    def step_time(self, tokens: int, seqs: int, kv_read: float, prefill_pairs: float) -> float:
        """Duration of one step; see the module docstring for N=tokens, S=seqs, K=kv_read, Q=prefill_pairs."""
        return (
            self.overhead_s
            + self.dense(tokens)
            + self.per_seq_s * seqs
            + self.kv_read_s_per_token * kv_read
            + self.prefill_attn_s_per_pair * prefill_pairs
        )

    def decode_base(self, n: int) -> float:
        """Time of a decode-only step of ``n`` sequences, without the KV-read term."""
        return self.overhead_s + self.dense(n) + self.per_seq_s * n

    def scaled(self, **factors: float) -> StepTimeModel:
        """A copy with some coefficients multiplied, e.g. ``scaled(kv_read_s_per_token=0.7)``."""
        names = {f.name for f in fields(self)}
        bad = sorted(set(factors) - names)
        if bad:
            raise ValueError(f"unknown step-time coefficient(s) {bad}; allowed: {sorted(names)}")
        vals = {n: getattr(self, n) * factors.get(n, 1.0) for n in names}
        return StepTimeModel(**vals)


def prefill_pairs(computed: int, chunk: int) -> float:
    """Causal (query, key) pairs of a prefill chunk of ``chunk`` tokens after ``computed`` cached tokens."""
    return chunk * (computed + (chunk + 1) / 2.0)

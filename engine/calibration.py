"""Fitting the step-time coefficients of the presets to public measurements.

Sources (facts in reference/simulation.md §5 and data/calibration/README.md; the Vidur file is copied in
engine/data/calibration/ with its licence note):

* Vidur's operator profile, H100, Llama-2-7B, TP1 (``vidur_h100_llama2_7b_mlp.csv``): non-attention time
  per step = 32 layers × Σ over per-layer operators of the median + the embedding once, for 1–4096 tokens.
* BLIS's fitted regression of vLLM v0.8.4 step times, Llama-3.1-8B, H100, TP1:
  ``step_µs = 5752.7 + 17.25·prefill_tokens + 6.00·decode_tokens``.
* Lambda's vllm-benchmark run of Meta-Llama-3-8B-Instruct on one H100 SXM (vLLM ≈ 0.6.0, 10 ShareGPT
  prompts sent at once): median TPOT 7.56 ms. The 10 prompt/output lengths of that run are below.
* BLIS's trained-physics model: reading the KV cache in decode costs 1.95× its HBM roofline.
* Hardware: H100 3.35 TB/s, H200 4.8 TB/s, same compute (989.5 dense BF16 TFLOPS).

Derivation of the H100 coefficients (``fit_h100``):

1. ``dense`` (floor, per-token slope, knee) — least squares on relative error against the Vidur profile
   averaged over ±64 tokens (one 128-row GEMM tile). The raw profile is a staircase (GEMM tile and wave
   quantisation: +28% between 512 and 520 tokens) that no smooth curve follows point by point; Llama-3-8B's
   matrix shapes put its steps elsewhere, so the preset keeps the smooth curve. Llama-3-8B has ~8% more
   dense weights and FLOPs than Llama-2-7B, while vLLM's fused kernels run faster than Vidur's
   operator-by-operator sum (BLIS's 17.25 µs per prefill token *with* attention is below Vidur's 20 µs
   without); the two are taken to cancel.
2. ``kv_read`` = 131,072 bytes per token / 3.35 TB/s × 1.95 (BLIS trained-physics multiplier).
3. ``prefill_attn`` = 4 · 32 heads · 128 dims · 32 layers FLOPs per (query, key) pair at half of the H100's
   dense BF16 peak (an assumption: FlashAttention-class kernels reach roughly 35–75% of peak).
4. ``overhead`` and ``per_seq`` — least squares on relative error against the BLIS regression over the
   random mixed batches of ``mixed_batches`` and, with equal total weight, against Lambda's median TPOT
   (the engine replays Lambda's 10 requests).

H200 (``derive_h200``): the memory-bound parts (dense floor, KV read) scale by 3.35/4.8; compute-bound
parts and the fixed overheads are kept. No public H200 step-time measurement is in the data.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np
from admit.engine.steptime import StepTimeModel
from scipy.optimize import least_squares

H100_HBM_BPS = 3.35e12
H200_HBM_BPS = 4.8e12
H100_BF16_FLOPS = 989.5e12
KV_BYTES_PER_TOKEN = 131_072
KV_READ_MULTIPLIER = 1.95
ATTN_FLOPS_PER_PAIR = 4 * 32 * 128 * 32
ATTN_EFFICIENCY = 0.5
VIDUR_FILE = "vidur_h100_llama2_7b_mlp.csv"
VIDUR_LAYERS = 32
VIDUR_LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
SMOOTH_HALF_WINDOW = 64
# BLIS regression (H100, Llama-3.1-8B, TP1), seconds
BLIS_H100 = (5752.7e-6, 17.25e-6, 6.00e-6)
# Lambda vllm-benchmark, 1x H100 SXM, Meta-Llama-3-8B-Instruct, 10 prompts at once
LAMBDA_INPUT_LENS = (13, 25, 27, 10, 329, 29, 399, 328, 4, 205)
LAMBDA_OUTPUT_LENS = (120, 429, 233, 194, 101, 741, 9, 3, 6, 31)
LAMBDA_MEDIAN_TPOT_S = 7.56e-3


def load_vidur_profile() -> tuple[np.ndarray, np.ndarray]:
    """(tokens, non-attention step seconds) of the Vidur H100 Llama-2-7B profile, TP1, sorted by tokens."""
    text = resources.files("admit.engine").joinpath("data", "calibration", VIDUR_FILE).read_text()
    tokens, secs = [], []
    for row in csv.DictReader(text.splitlines()):
        if row["num_tensor_parallel_workers"] != "1":
            continue
        per_layer = sum(float(row[f"time_stats.{op}.median"]) for op in VIDUR_LAYER_OPS)
        tokens.append(int(row["num_tokens"]))
        secs.append((VIDUR_LAYERS * per_layer + float(row["time_stats.emb.median"])) * 1e-3)
    order = np.argsort(tokens, kind="stable")
    return np.asarray(tokens, float)[order], np.asarray(secs)[order]


def smoothed(tokens: np.ndarray, secs: np.ndarray, half_window: int = SMOOTH_HALF_WINDOW) -> np.ndarray:
    """Mean of the profile over the points within ±half_window tokens of each point."""
    return np.array([secs[np.abs(tokens - n) <= half_window].mean() for n in tokens])


def fit_dense() -> tuple[float, float, float]:
    """(floor_s, s_per_token, knee) of the smooth roofline fitted to the smoothed Vidur profile."""
    n, t = load_vidur_profile()
    ts = smoothed(n, t)
    scale = np.array([1e-3, 1e-5, 1.0])

    def resid(z: np.ndarray) -> np.ndarray:
        fl, cp, q = z * scale
        return (fl**q + (cp * n) ** q) ** (1 / q) / ts - 1

    res = least_squares(resid, [5.6, 2.0, 1.5], bounds=([0.1, 0.1, 1.0], [50, 100, 10]))
    fl, cp, q = res.x * scale
    return float(fl), float(cp), float(q)


def blis_h100(prefill_tokens: np.ndarray, decode_tokens: np.ndarray) -> np.ndarray:
    c0, cp, cd = BLIS_H100
    return c0 + cp * prefill_tokens + cd * decode_tokens


@dataclass(frozen=True)
class Batches:
    """Random mixed batches: columns of per-batch tokens, sequences, decode KV read and prefill pairs."""

    prefill: np.ndarray
    decode: np.ndarray
    seqs: np.ndarray
    kv_read: np.ndarray
    pairs: np.ndarray

    def step_times(self, m: StepTimeModel) -> np.ndarray:
        n = self.prefill + self.decode
        q = m.dense_knee
        dense = (m.dense_floor_s**q + (m.dense_s_per_token * n) ** q) ** (1 / q)
        return (
            m.overhead_s
            + dense
            + m.per_seq_s * self.seqs
            + m.kv_read_s_per_token * self.kv_read
            + m.prefill_attn_s_per_pair * self.pairs
        )


def mixed_batches(seed: int = 0, n: int = 2000, max_context: int = 512) -> Batches:
    """Random mixed batches: prefill chunks and decoding sequences in the same step.

    Prefill: uniform 1–4096 tokens, cut into prompts of uniform 16–1024 tokens starting from an empty
    cache. Decode: uniform 1–64 sequences, each with a context uniform in 1–``max_context`` tokens.
    """
    rng = np.random.default_rng(seed)
    cols: list[tuple[int, int, int, int, float]] = []
    for _ in range(n):
        d = int(rng.integers(1, 65))
        kv = int(rng.integers(1, max_context + 1, size=d).sum())
        p = int(rng.integers(1, 4097))
        seqs, pairs, left = d, 0.0, p
        while left > 0:
            c = min(left, int(rng.integers(16, 1025)))
            pairs += c * (c + 1) / 2.0
            left -= c
            seqs += 1
        cols.append((p, d, seqs, kv, pairs))
    a = np.array(cols, float)
    return Batches(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4])


def decode_batches(seqs: int, context: int) -> Batches:
    """One decode-only batch of ``seqs`` sequences of ``context`` tokens (for the context sweep)."""
    one = np.ones(1)
    return Batches(0 * one, seqs * one, seqs * one, seqs * context * one, 0 * one)


def lambda_tpots(model: StepTimeModel) -> np.ndarray:
    """Per-request TPOT (s) of Lambda's 10 requests, submitted together to the H100 preset's engine."""
    from admit.engine.presets import get_preset
    from admit.engine.request import Request
    from admit.engine.token_engine import TokenEngine

    eng = TokenEngine(get_preset("h100-llama3-8b"), step_model=model)
    sizes = zip(LAMBDA_INPUT_LENS, LAMBDA_OUTPUT_LENS, strict=True)
    reqs = [Request(i, 0, 0.0, p, o, 0.5) for i, (p, o) in enumerate(sizes)]
    for r in reqs:
        eng.submit(r, 0.0)
    while eng.next_event_time() < math.inf:
        eng.process_event(eng.next_event_time())
    return np.array([(r.finished - r.first_token) / (r.output_tokens - 1) for r in reqs if r.output_tokens > 1])


def physics_h100() -> tuple[float, float]:
    """(kv_read_s_per_token, prefill_attn_s_per_pair) for the H100 from bandwidth and FLOPs."""
    kv = KV_BYTES_PER_TOKEN / H100_HBM_BPS * KV_READ_MULTIPLIER
    pa = ATTN_FLOPS_PER_PAIR / (ATTN_EFFICIENCY * H100_BF16_FLOPS)
    return kv, pa


def fit_h100(batches: Batches | None = None) -> StepTimeModel:
    """The H100 preset's coefficients, by the derivation in the module docstring."""
    fl, cp, q = fit_dense()
    kv, pa = physics_h100()
    b = batches or mixed_batches()
    target = blis_h100(b.prefill, b.decode)
    w_lambda = math.sqrt(len(target))  # Lambda's point weighs as much as all the batches together

    def model(z: np.ndarray) -> StepTimeModel:
        return StepTimeModel(float(z[0]) * 1e-3, fl, cp, q, float(z[1]) * 1e-6, kv, pa)

    def resid(z: np.ndarray) -> np.ndarray:
        m = model(z)
        r_blis = b.step_times(m) / target - 1
        r_lambda = float(np.median(lambda_tpots(m))) / LAMBDA_MEDIAN_TPOT_S - 1
        return np.append(r_blis, w_lambda * r_lambda)

    res = least_squares(resid, [0.5, 5.0], bounds=([0.0, 0.0], [10.0, 100.0]), diff_step=1e-3)
    return model(res.x)


def derive_h200(h100: StepTimeModel) -> StepTimeModel:
    """H200: memory-bound parts scaled by the HBM bandwidth ratio, the rest kept."""
    ratio = H100_HBM_BPS / H200_HBM_BPS
    return h100.scaled(dense_floor_s=ratio, kv_read_s_per_token=ratio)


# ---------------------------------------------------------------------------------------- a measured engine
@dataclass(frozen=True)
class StepSample:
    """One measured engine step (or a median of like steps): ``tokens`` N, ``seqs`` S, ``kv_read`` K and
    ``prefill_pairs`` Q as in :mod:`admit.engine.steptime`, and its measured duration in seconds.
    ``kind`` is ``prefill`` (one request's whole prompt in one step, measured as its TTFT) or ``decode``
    (S sequences decoding, measured as the time between a stream's tokens)."""

    kind: str
    tokens: int
    seqs: int
    kv_read: float
    prefill_pairs: float
    seconds: float


FIT_NAMES = ("overhead_s", "dense_floor_s", "dense_s_per_token", "dense_knee", "per_seq_s", "kv_read_s_per_token",
             "prefill_attn_s_per_pair")


def fit_measured(samples: list[StepSample]) -> tuple[StepTimeModel, float]:
    """The step-time coefficients that fit measured steps best (least squares on relative error; every
    coefficient >= 0, the knee in [1, 8]), and the request overhead of a prefill sample (seconds a TTFT
    has beyond its step: HTTP, tokenising, scheduling; fitted too, reported, not part of the model).

    Prefill and decode samples get equal total weight, so the many decode steps do not drown the prompts.
    """
    if sum(s.kind == "prefill" for s in samples) < 3 or sum(s.kind == "decode" for s in samples) < 3:
        raise ValueError("fit_measured needs at least 3 prefill and 3 decode samples")
    kind = np.array([s.kind == "prefill" for s in samples])
    n = np.array([s.tokens for s in samples], dtype=float)
    seqs = np.array([s.seqs for s in samples], dtype=float)
    kv = np.array([s.kv_read for s in samples], dtype=float)
    pairs = np.array([s.prefill_pairs for s in samples], dtype=float)
    secs = np.array([s.seconds for s in samples], dtype=float)
    w = np.where(kind, 0.5 / kind.sum(), 0.5 / (~kind).sum()) ** 0.5
    # scaled so that every parameter is of order 1 for the optimiser
    scale = np.array([1e-3, 1e-3, 1e-5, 1.0, 1e-4, 1e-8, 1e-9, 1e-3])

    def predict(x: np.ndarray) -> np.ndarray:
        o, floor, slope, knee, per_seq, kv_s, attn, req = x * scale
        dense = (floor**knee + (slope * n) ** knee) ** (1.0 / knee)
        return o + dense + per_seq * seqs + kv_s * kv + attn * pairs + np.where(kind, req, 0.0)

    def resid(x: np.ndarray) -> np.ndarray:
        return w * (predict(x) - secs) / secs

    x0 = np.array([1.0, 10.0, 50.0, 2.0, 1.0, 1.0, 1.0, 5.0])
    lo = np.array([0, 0, 0, 1.0, 0, 0, 0, 0])
    hi = np.array([np.inf, np.inf, np.inf, 8.0, np.inf, np.inf, np.inf, np.inf])
    fit = least_squares(resid, x0, bounds=(lo, hi), x_scale="jac", max_nfev=20_000)
    vals = fit.x * scale
    model = StepTimeModel(**{k: float(f"{v:.4g}") for k, v in zip(FIT_NAMES, vals[:7], strict=True)})
    return model, float(f"{vals[7]:.4g}")


def predict_sample(model: StepTimeModel, s: StepSample, request_overhead_s: float = 0.0) -> float:
    """The model's duration for one sample (a prefill sample includes the request overhead)."""
    t = model.step_time(s.tokens, s.seqs, s.kv_read, s.prefill_pairs)
    return t + (request_overhead_s if s.kind == "prefill" else 0.0)

"""What one token engine can serve: a closed-form capacity estimate for a request-size mix, and its check.

Scenario families scale their load to "0.5–1.5× the preset's capacity", and capacity depends on the
requests: one H200 serves ~23 Azure conversation requests/s but ~1.3 long-context ones. The estimate is a
fluid model of a saturated engine built from the step-time model (engine/steptime.py). Per request, on
average over the mix: T = E[P + O] tokens through the dense layers, D = E[O] steps in the batch (one output
token each), R = E[(O − 1)·P + O·(O − 1)/2] KV tokens read by its decode steps (the j-th reads P + j), and
A = E[P·(P + 1)/2] causal (query, key) pairs of its prefill, however chunked prefill cuts it. With M
requests running, M / D of them finish per step, and a step is::

    step(M) = overhead + dense(M·T/D) + per_seq·M + kv_read·(M/D)·R + prefill_attn·(M/D)·A
    capacity = (M/D) / step(M)   requests/s,   M = min(max_num_seqs, KV tokens / T, B·D/T)

More running requests share a step's fixed costs (its overhead, the dense floor of reading the weights), so
the best M is the largest the engine allows: no more than ``max_num_seqs``; no more than the KV cache holds
at full length (so none is ever preempted: the thrash a larger M causes is what admission control is for);
and no more than fill the token budget B (``max_num_batched_tokens``), where every step runs B tokens and the
model reduces to the work per request ``(T/B)·(overhead + dense(B)) + kv_read·R + prefill_attn·A``.
Prefill-heavy mixes sit on that budget bound, decode-heavy ones on the KV bound.

Utilisations add: a tenant of rate λ on a mix of capacity μ uses λ/μ of the engine, and the load of several
tenants is Σ λ_i / μ_i (envs/family.py's ``scenario_load``).

How good it is: :func:`measure_capacity` runs the token engine itself in closed loop (a fixed number of
requests always in it) and reports the best throughput over concurrencies 1, 2, 4, ..., 1024. On h200-llama3-8b
the estimate is within −4.3 % … +2.8 % of that on the 18 of 20 mixes tried (the Azure code and conversation
traces, 12 ServeGen clients, synthetic chat, agentic, long-output and long-context mixes: docs/scenarios.md)
where the engine serves under ~100 requests/s; the other two, of a few tokens per request, come out ~20 % low.
tests/envs/test_family.py checks two. It is deterministic and costs microseconds, which is why family sampling
uses it rather than the simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from admit.engine.presets import Preset, get_preset
from admit.engine.request import Request

CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # what measure_capacity tries by default


def _preset(preset: Preset | str) -> Preset:
    return get_preset(preset) if isinstance(preset, str) else preset


def _sizes(prompt: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(prompt, dtype=np.float64)
    o = np.asarray(output, dtype=np.float64)
    if p.ndim != 1 or o.shape != p.shape or len(p) == 0:
        raise ValueError(f"prompt and output sizes must be two non-empty 1-D arrays of one length, got {p.shape}, "
                         f"{o.shape}")
    if not (np.all(p >= 1) and np.all(o >= 1)):
        raise ValueError("prompt and output sizes must be >= 1 token")
    return p, o


@dataclass(frozen=True)
class Mix:
    """A request-size mix as the estimate sees it: the per-request means T, D, R, A of the module docstring
    and the largest request (prompt + output tokens), which must fit in the KV cache."""

    tokens: float  # T = E[P + O]
    decodes: float  # D = E[O]
    reads: float  # R = E[(O − 1)·P + O·(O − 1)/2]
    pairs: float  # A = E[P·(P + 1)/2]
    largest: float  # max(P + O)

    @classmethod
    def of_pairs(cls, prompt: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray) -> Mix:
        """The mix of these (prompt, output) pairs, e.g. a trace's rows (sizes that go together stay together)."""
        p, o = _sizes(prompt, output)
        return cls(
            tokens=float((p + o).mean()),
            decodes=float(o.mean()),
            reads=float(((o - 1.0) * p + o * (o - 1.0) / 2.0).mean()),
            pairs=float((p * (p + 1.0) / 2.0).mean()),
            largest=float((p + o).max()),
        )

    @classmethod
    def of_independent(cls, prompt: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray) -> Mix:
        """The mix of independent prompt and output sizes, each given by a sample of its own (any lengths):
        the means are the marginals' moments, so no pairing adds noise."""
        p = np.asarray(prompt, dtype=np.float64)
        o = np.asarray(output, dtype=np.float64)
        if p.ndim != 1 or o.ndim != 1 or not len(p) or not len(o) or p.min() < 1 or o.min() < 1:
            raise ValueError("prompt and output samples must be non-empty 1-D arrays of sizes >= 1 token")
        ep, ep2, eo, eo2 = float(p.mean()), float((p * p).mean()), float(o.mean()), float((o * o).mean())
        return cls(tokens=ep + eo, decodes=eo, reads=(eo - 1.0) * ep + (eo2 - eo) / 2.0, pairs=(ep2 + ep) / 2.0,
                   largest=float(p.max() + o.max()))


def mix_capacity_rps(
    preset: Preset | str, mix: Mix, max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None
) -> float:
    """Estimated requests/s the engine sustains on ``mix``: the saturated fluid model of the module docstring."""
    pr = _preset(preset)
    m = pr.step
    budget = int(max_num_batched_tokens or pr.max_num_batched_tokens)
    kv_tokens = pr.num_gpu_blocks * pr.block_size
    if mix.largest > kv_tokens:
        raise ValueError(f"a request of {mix.largest:.0f} tokens can never fit in the {kv_tokens}-token KV cache")
    seqs = min(float(max_num_seqs or pr.max_num_seqs), kv_tokens / mix.tokens, budget * mix.decodes / mix.tokens)
    finishing = seqs / mix.decodes  # requests finishing per step
    step = (
        m.overhead_s
        + m.dense(finishing * mix.tokens)
        + m.per_seq_s * seqs
        + m.kv_read_s_per_token * finishing * mix.reads
        + m.prefill_attn_s_per_pair * finishing * mix.pairs
    )
    return finishing / step


def capacity_rps(
    preset: Preset | str,
    prompt: Sequence[int] | np.ndarray,
    output: Sequence[int] | np.ndarray,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
) -> float:
    """``mix_capacity_rps`` of the mix of these (prompt, output) pairs."""
    return mix_capacity_rps(preset, Mix.of_pairs(prompt, output), max_num_batched_tokens, max_num_seqs)


def closed_loop_rps(
    preset: Preset | str,
    prompt: Sequence[int] | np.ndarray,
    output: Sequence[int] | np.ndarray,
    concurrency: int,
    requests: int,
) -> float:
    """Throughput of the token engine kept at ``concurrency`` requests (a finished one is replaced at once),
    over ``requests`` requests cycling through the pairs; measured between the 20th and 80th percentile of
    the finishes, so the ramp-up and the drain are left out."""
    from admit.engine.token_engine import TokenEngine  # the measurement only

    if concurrency < 1 or requests < 10:
        raise ValueError(f"need concurrency >= 1 and requests >= 10, got {concurrency}, {requests}")
    p, o = _sizes(prompt, output)
    eng = TokenEngine(_preset(preset))
    now = 0.0
    sent = 0
    finishes: list[float] = []

    def send() -> None:
        nonlocal sent
        k = sent % len(p)
        eng.submit(Request(sent, 0, now, int(p[k]), int(o[k]), 0.5), now)
        sent += 1

    for _ in range(min(concurrency, requests)):
        send()
    while len(finishes) < requests:
        now = eng.next_event_time()
        for _r in eng.process_event(now):
            finishes.append(now)
            if sent < requests:
                send()
    a, b = int(0.2 * requests), int(0.8 * requests) - 1
    return (b - a) / (finishes[b] - finishes[a])


def measure_capacity(
    preset: Preset | str,
    prompt: Sequence[int] | np.ndarray,
    output: Sequence[int] | np.ndarray,
    concurrencies: Sequence[int] = CONCURRENCIES,
    requests: int = 3000,
) -> tuple[float, int]:
    """The best closed-loop throughput over ``concurrencies`` and the concurrency that reached it: what the
    estimate is checked against (seconds per call, not microseconds). Each run has at least 6 requests per
    slot of concurrency, so that the measured stretch is past the ramp-up."""
    best = (0.0, 0)
    for c in concurrencies:
        best = max(best, (closed_loop_rps(preset, prompt, output, c, max(requests, 6 * c)), c))
    return best

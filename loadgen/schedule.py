"""The stage schedule: every request's send offset, tenant and token counts, fixed before the start.

The parent draws each tenant's arrivals and lengths from its own stream (``SeedSequence(seed)`` spawned
once per tenant, in tenant order, so adding a tenant does not change the others' draws), merges all
tenants by send time, and deals the merged sequence to workers by striding: worker ``k`` of ``N`` gets
requests ``k, k+N, k+2N, …``. Striding keeps each worker's share a thinned copy of the whole process,
so every worker carries the same load shape and no request moves between processes afterwards.

A worker imports this module for :class:`Schedule` alone; what draws one (the configuration, the workload
models, pydantic) is imported by :func:`build_schedule`, in the parent, so a worker starts without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from admit.loadgen.config import RunConfig


@dataclass
class Schedule:
    """Parallel arrays sorted by ``offset_ns``; ``tenant`` indexes ``RunConfig.tenants``."""

    offset_ns: np.ndarray
    tenant: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    duration_s: float

    def __len__(self) -> int:
        return len(self.offset_ns)

    def share(self, worker: int, workers: int) -> Schedule:
        """Worker ``worker``'s strided share (see module docstring)."""
        sl = slice(worker, None, workers)
        return Schedule(
            self.offset_ns[sl].copy(),
            self.tenant[sl].copy(),
            self.prompt_tokens[sl].copy(),
            self.output_tokens[sl].copy(),
            self.duration_s,
        )

    def count_by_tenant(self, n_tenants: int) -> list[int]:
        return np.bincount(self.tenant, minlength=n_tenants).tolist()


def build_schedule(cfg: RunConfig, scale: float = 1.0, stage: int = 0) -> Schedule:
    """Draw one stage's schedule; ``scale`` multiplies every tenant's rate (used by sweeps)."""
    from admit.loadgen.arrivals import arrival_times
    from admit.loadgen.traces import read_trace

    root = np.random.SeedSequence([cfg.seed, stage])
    streams = root.spawn(len(cfg.tenants))
    parts: list[tuple[np.ndarray, ...]] = []
    for idx, (tenant, stream) in enumerate(zip(cfg.tenants, streams, strict=True)):
        rng = np.random.default_rng(stream)
        if tenant.arrival == "trace":
            trace = read_trace(tenant.trace or "", tenant.trace_tenant).window(cfg.duration, tenant.trace_speedup)
            offs, prompt, out = trace.offsets_ns(), trace.prompt_tokens, trace.output_tokens
        else:
            offs = arrival_times(tenant.arrival_spec(scale), cfg.duration, rng)
            prompt = tenant.prompt.sample(rng, len(offs))
            out = tenant.output.sample(rng, len(offs))
        parts.append((offs, np.full(len(offs), idx, dtype=np.int32), prompt, out))
    offs = np.concatenate([p[0] for p in parts])
    order = np.argsort(offs, kind="stable")
    return Schedule(
        offs[order],
        np.concatenate([p[1] for p in parts])[order],
        np.concatenate([p[2] for p in parts]).astype(np.int64)[order],
        np.concatenate([p[3] for p in parts]).astype(np.int64)[order],
        cfg.duration,
    )

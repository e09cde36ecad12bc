"""Per-tenant measurements of one stage: histograms and counters that merge across workers.

For a successful streamed request with actual send time ``s``, scheduled send time ``σ``, token-event
arrival times ``t_1 … t_m`` (taken when the bytes arrived), end of response ``d`` and ``n`` output
tokens (the server's ``usage.completion_tokens``, else ``m``):

* ``ttft = t_1 - s``, ``e2e = d - s``;
* ``itl`` = every gap ``t_j - t_{j-1}`` (one sample per gap);
* ``tpot = (e2e - ttft) / (n - 1)`` for ``n > 1`` (vLLM's definition);
* ``ntpot = e2e / n`` (normalised time per output token: queueing, prefill and decode over tokens);
* the scheduled view replaces ``s`` by ``σ``: ``ttft_sched``, ``e2e_sched``, ``ntpot_sched``;
* ``send_lag = s - σ``, recorded for every request that was sent, failed or not.

A non-streamed request (``stream: false``) has one "token time", the first byte of its JSON answer: it
gets ``ttft``, ``e2e``, ``ntpot`` and their scheduled views, and no ``itl`` or ``tpot``.

All values are integer nanoseconds.

A stage's **warm-up** (``warmup`` seconds): a request *scheduled* before ``t0 + warmup`` is sent and
answered like any other but counted only in ``warmup_scheduled`` / ``warmup_completed`` /
``warmup_failed``; every other figure — latencies, ``ok``, ``good``, statuses, errors, retries, tokens — is
over the requests scheduled after it. ``scheduled`` and ``sent`` (and the send lag) count every request,
because the generator must keep its schedule through the warm-up too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from admit.core.slo import SLO
from admit.loadgen.histogram import Histogram

LATENCY_METRICS = (
    "ttft",
    "itl",
    "tpot",
    "e2e",
    "ntpot",
    "ttft_sched",
    "e2e_sched",
    "ntpot_sched",
    "send_lag",
)
COUNTERS = ("scheduled", "sent", "ok", "good", "retries", "prompt_tokens", "output_tokens", "warmup_scheduled",
            "warmup_completed", "warmup_failed")
SLO_METRIC = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_ms": "e2e", "ntpot_ms": "ntpot"}


@dataclass
class TenantMetrics:
    """What one worker (or, after merging, all workers) measured for one tenant."""

    hist: dict[str, Histogram] = field(default_factory=lambda: {m: Histogram() for m in LATENCY_METRICS})
    scheduled: int = 0
    sent: int = 0
    ok: int = 0
    good: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)
    # requests scheduled in the stage's warm-up: sent and answered like the others, counted only here
    warmup_scheduled: int = 0
    warmup_completed: int = 0
    warmup_failed: int = 0

    def count_error(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def count_status(self, code: int) -> None:
        key = str(code)
        self.status[key] = self.status.get(key, 0) + 1

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def merge(self, other: TenantMetrics) -> TenantMetrics:
        for name, h in other.hist.items():
            self.hist.setdefault(name, Histogram()).merge(h)
        for attr in COUNTERS:
            setattr(self, attr, getattr(self, attr) + getattr(other, attr))
        for src, dst in ((other.errors, self.errors), (other.status, self.status)):
            for k, v in src.items():
                dst[k] = dst.get(k, 0) + v
        return self

    def to_dict(self) -> dict:
        return {
            "hist": {k: h.to_dict() for k, h in self.hist.items()},
            "scheduled": self.scheduled,
            "sent": self.sent,
            "ok": self.ok,
            "good": self.good,
            "retries": self.retries,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "errors": dict(self.errors),
            "status": dict(self.status),
            "warmup_scheduled": self.warmup_scheduled,
            "warmup_completed": self.warmup_completed,
            "warmup_failed": self.warmup_failed,
        }

    @classmethod
    def from_dict(cls, data: dict) -> TenantMetrics:
        m = cls(hist={k: Histogram.from_dict(v) for k, v in data["hist"].items()})
        for attr in COUNTERS:
            setattr(m, attr, int(data[attr]))
        m.errors = {str(k): int(v) for k, v in data["errors"].items()}
        m.status = {str(k): int(v) for k, v in data["status"].items()}
        return m


def slo_limits_ns(slo_ms: dict[str, float]) -> dict[str, int]:
    """SLO thresholds keyed by metric name, in nanoseconds."""
    return {SLO_METRIC[k]: int(v * 1_000_000) for k, v in slo_ms.items()}


def request_limits_ns(slo: SLO) -> dict[str, int]:
    """A tenant's per-request objectives (core/slo.py: ttft_s, tpot_s, e2e_s) as thresholds in nanoseconds,
    keyed like `slo_limits_ns`; empty when the tenant has none."""
    pairs = (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s))
    return {k: int(v * 1e9) for k, v in pairs if v is not None}

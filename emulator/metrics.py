"""``/metrics``: vLLM V1's Prometheus metrics, same names, labels and buckets, from the emulated engine.

Every series carries ``model_name`` (the served name) and ``engine`` ("0"), as vLLM V1 does;
``vllm:cache_config_info`` carries the cache settings and ``engine`` only. Engine-level values (gauges,
token and preemption counters, tokens per step) are read from the token engine at scrape time, after the
engine loop has caught up with the clock; per-request histograms are filled when requests finish.

Exposed (``_total`` is added to counters by the exposition format, as prometheus_client does for vLLM):
gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``;
counters ``vllm:num_preemptions``, ``vllm:prompt_tokens``, ``vllm:generation_tokens``,
``vllm:request_success{finished_reason=stop|length|abort}``; histograms ``vllm:iteration_tokens_total``,
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:request_time_per_output_token_seconds``, ``vllm:e2e_request_latency_seconds``,
``vllm:request_{queue,prefill,decode,inference}_time_seconds``, ``vllm:request_{prompt,generation}_tokens``,
``vllm:request_max_num_generation_tokens``, ``vllm:request_params_max_tokens``, ``vllm:request_params_n``;
``vllm:cache_config_info``.

One series of the emulator's own, under the project's prefix: ``admit_emulator_event_lateness_seconds``,
how late (wall seconds) the engine loop processed each engine event. While it stays at a few
milliseconds the streamed timings follow the model; seconds mean the process is short of CPU.

Aborted requests (client gone) count in ``request_success{finished_reason="abort"}`` but enter no
histogram, so every per-request histogram's count equals the ``stop`` + ``length`` successes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from admit.emulator.histogram import (
    ITERATION_TOKEN_BUCKETS,
    N_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    Hist,
    buckets_1_2_5,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

FINISHED_REASONS = ("stop", "length", "abort")
LATENESS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0)


class EngineGauges(Protocol):
    """What the metrics read from the engine at scrape time."""

    num_running: int
    num_waiting: int
    kv_usage: float
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    iteration_tokens: dict[int, int]


@dataclass
class EngineSnapshot:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_preemptions: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    iteration_tokens: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FinishedTimes:
    """One finished request's intervals (wall seconds) and sizes, as vLLM records them."""

    ttft: float
    e2e: float
    queue: float
    prefill: float
    decode: float
    inference: float
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int


_HISTS = (
    ("ttft", "vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS),
    ("itl", "vllm:inter_token_latency_seconds", "Time between output tokens of a request, seconds.",
     TOKEN_LATENCY_BUCKETS),
    ("tpot", "vllm:request_time_per_output_token_seconds", "Decode time per output token after the first, "
     "seconds (0 for one-token answers).", TOKEN_LATENCY_BUCKETS),
    ("e2e", "vllm:e2e_request_latency_seconds", "Request latency from arrival to finish, seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("queue", "vllm:request_queue_time_seconds", "Time waiting before first scheduled, seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("prefill", "vllm:request_prefill_time_seconds", "Time from first scheduled to first token, seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("decode", "vllm:request_decode_time_seconds", "Time from first to last token, seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("inference", "vllm:request_inference_time_seconds", "Time from first scheduled to last token, seconds.",
     REQUEST_LATENCY_BUCKETS),
)  # fmt: skip


class VllmMetrics:
    """The emulator's metrics, collected into a private registry (one per server)."""

    def __init__(self, model_name: str, max_model_len: int, cache_info: dict[str, str], engine: str = "0") -> None:
        self.labels = [model_name, engine]
        self.engine_label = engine
        self.cache_info = cache_info
        self.hists: dict[str, Hist] = {key: Hist(b) for key, _, _, b in _HISTS}
        tok = buckets_1_2_5(max_model_len)
        self.hists["prompt_tokens"] = Hist(tok)
        self.hists["generation_tokens"] = Hist(tok)
        self.hists["max_num_generation_tokens"] = Hist(tok)
        self.hists["params_max_tokens"] = Hist(tok)
        self.hists["params_n"] = Hist(N_BUCKETS)
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        self.lateness = Hist(LATENESS_BUCKETS)
        self.engine: EngineGauges = EngineSnapshot()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # ---------------------------------------------------------------- recording
    def observe_finished(self, reason: str, t: FinishedTimes) -> None:
        self.success[reason] += 1
        h = self.hists
        h["ttft"].observe(t.ttft)
        h["e2e"].observe(t.e2e)
        h["queue"].observe(t.queue)
        h["prefill"].observe(t.prefill)
        h["decode"].observe(t.decode)
        h["inference"].observe(t.inference)
        h["tpot"].observe(t.decode / (t.generation_tokens - 1) if t.generation_tokens > 1 else 0.0)
        h["prompt_tokens"].observe(t.prompt_tokens)
        h["generation_tokens"].observe(t.generation_tokens)
        h["max_num_generation_tokens"].observe(t.generation_tokens)
        h["params_max_tokens"].observe(t.max_tokens)
        h["params_n"].observe(1)

    def observe_lateness(self, seconds: float) -> None:
        self.lateness.observe(seconds)

    def observe_abort(self) -> None:
        self.success["abort"] += 1

    # ---------------------------------------------------------------- exposition
    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        lab = ["model_name", "engine"]
        e = self.engine
        for name, doc, v in (
            ("vllm:num_requests_running", "Requests in model execution batches.", e.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", e.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", e.kv_usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=lab)
            g.add_metric(self.labels, v)
            yield g
        for name, doc, v in (
            ("vllm:num_preemptions", "Cumulative preemptions of requests by the engine.", e.num_preemptions),
            ("vllm:prompt_tokens", "Prefill tokens processed.", e.prompt_tokens_total),
            ("vllm:generation_tokens", "Generation tokens processed.", e.generation_tokens_total),
        ):
            c = CounterMetricFamily(name, doc, labels=lab)
            c.add_metric(self.labels, v)
            yield c
        c = CounterMetricFamily("vllm:request_success", "Successfully processed requests.",
                                labels=[*lab, "finished_reason"])  # fmt: skip
        for reason, v in self.success.items():
            c.add_metric([*self.labels, reason], v)
        yield c
        it = Hist(ITERATION_TOKEN_BUCKETS)
        for tokens, steps in e.iteration_tokens.items():
            it.observe(tokens, steps)
        yield self._hist_family("vllm:iteration_tokens_total", "Tokens per engine step.", it)
        for key, name, doc, _ in _HISTS:
            yield self._hist_family(name, doc, self.hists[key])
        for key, name, doc in (
            ("prompt_tokens", "vllm:request_prompt_tokens", "Prefill tokens per request."),
            ("generation_tokens", "vllm:request_generation_tokens", "Generation tokens per request."),
            ("max_num_generation_tokens", "vllm:request_max_num_generation_tokens",
             "Maximum generation tokens per request."),
            ("params_max_tokens", "vllm:request_params_max_tokens", "The max_tokens request parameter."),
            ("params_n", "vllm:request_params_n", "The n request parameter."),
        ):  # fmt: skip
            yield self._hist_family(name, doc, self.hists[key])
        doc = "How late the emulator's engine loop processed each engine event."
        yield self._hist_family("admit_emulator_event_lateness_seconds", doc, self.lateness)
        keys = [*self.cache_info, "engine"]
        g = GaugeMetricFamily("vllm:cache_config_info", "Cache settings of the engine (always 1).", labels=keys)
        g.add_metric([*self.cache_info.values(), self.engine_label], 1.0)
        yield g

    def _hist_family(self, name: str, doc: str, h: Hist) -> HistogramMetricFamily:
        f = HistogramMetricFamily(name, doc, labels=["model_name", "engine"])
        h.add_to(f, self.labels)
        return f

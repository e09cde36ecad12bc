"""/metrics of a real emulator: vLLM V1 names, labels and buckets; invariants; preemption exactly at KV exhaustion."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from emulator_helpers import Emulator, start_emulator

MODEL = "m"
LABELS = {"model_name": MODEL, "engine": "0"}
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]  # fmt: skip
TOKEN_LAT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQ_LAT = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0]  # fmt: skip
ITER = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PER_REQUEST_HISTS = [
    "vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds", "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
]  # fmt: skip


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


def complete(emu: Emulator, words: int, max_tokens: int, stream: bool = False) -> dict:
    status, body = emu.json("POST", "/v1/completions", {"model": MODEL, "prompt": "hello" + " hello" * (words - 1),
                            "max_tokens": max_tokens, "ignore_eos": True})  # fmt: skip
    assert status == 200, body
    return body


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator("--model", MODEL, "--max-model-len", "2048", "--latency-multiplier", "0.5")
    yield e
    e.stop()


def _buckets(emu_metrics: dict, name: str) -> list[float]:
    return [float(s.labels["le"]) for s in emu_metrics[name + "_bucket"] if s.labels["le"] != "+Inf"]


def test_names_labels_and_buckets_are_vllm_v1s(emu: Emulator) -> None:
    complete(emu, 10, 3)
    m = emu.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:request_success_total", "vllm:iteration_tokens_total_count", *(h + "_sum" for h in
                 PER_REQUEST_HISTS), "vllm:inter_token_latency_seconds_count"):  # fmt: skip
        assert name in m, name
        for s in m[name]:
            assert {k: s.labels[k] for k in LABELS} == LABELS, (name, s.labels)
    # every vLLM finish reason is a series, the two the emulator never ends a request with too
    assert {s.labels["finished_reason"] for s in m["vllm:request_success_total"]} == {"stop", "length", "abort",
                                                                                    "error", "repetition"}
    assert _buckets(m, "vllm:time_to_first_token_seconds") == TTFT
    for h in ("vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds"):
        assert _buckets(m, h) == TOKEN_LAT
    for h in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
              "vllm:request_inference_time_seconds"):  # fmt: skip
        assert _buckets(m, h) == REQ_LAT
    assert _buckets(m, "vllm:iteration_tokens_total") == ITER
    assert m["admit_emulator_event_lateness_seconds_count"][0].value >= 1  # the project's own series
    assert _buckets(m, "vllm:request_prompt_tokens") == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    (info,) = m["vllm:cache_config_info"]
    assert info.value == 1 and info.labels["engine"] == "0" and info.labels["block_size"] == "16"
    assert int(info.labels["num_gpu_blocks"]) > 50_000  # the H200 preset's KV cache
    tokens = int(info.labels["num_gpu_blocks"]) * 16
    assert info.labels["kv_cache_size_tokens"] == str(tokens)
    assert float(info.labels["kv_cache_max_concurrency"]) == tokens / 2048  # KV tokens / max_model_len, as vLLM
    assert {s.labels["sleep_state"]: s.value for s in m["vllm:engine_sleep_state"]} == {
        "awake": 1, "weights_offloaded": 0, "discard_all": 0}


def test_counts_and_token_totals_match_the_requests(emu: Emulator) -> None:
    before = emu.metrics()
    sizes = [(5 + 7 * i, 3 + 5 * i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda s: complete(emu, *s), sizes))
    after = emu.metrics()

    def delta(name: str, **labels: str) -> float:
        def get(m: dict) -> float:
            return sum(s.value for s in m[name] if all(s.labels.get(k) == v for k, v in labels.items()))

        return get(after) - get(before)

    n = len(sizes)
    prompt = sum(b["usage"]["prompt_tokens"] for b in bodies)
    gen = sum(b["usage"]["completion_tokens"] for b in bodies)
    assert gen == sum(o for _, o in sizes)
    assert delta("vllm:request_success_total", finished_reason="length") == n
    for h in PER_REQUEST_HISTS:
        assert delta(h + "_count") == n, h
        assert delta(h + "_bucket", le="+Inf") == n, h
    assert delta("vllm:request_prompt_tokens_sum") == prompt
    assert delta("vllm:request_generation_tokens_sum") == gen
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:generation_tokens_total") == gen
    # no prefix cache, no KV transfer: every prompt token is computed here, once per request
    assert delta("vllm:prompt_tokens_by_source_total", source="local_compute") == prompt
    assert delta("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 0
    assert delta("vllm:request_prefill_kv_computed_tokens_sum") == prompt
    assert delta("vllm:request_num_preemptions_count") == n
    # each token but a request's last is computed in exactly one step (no preemption here)
    assert delta("vllm:num_preemptions_total") == 0
    assert delta("vllm:iteration_tokens_total_sum") == prompt + gen - n
    assert delta("vllm:inter_token_latency_seconds_count") == gen - n
    ttft = delta("vllm:time_to_first_token_seconds_sum")
    queue_prefill = delta("vllm:request_queue_time_seconds_sum") + delta("vllm:request_prefill_time_seconds_sum")
    assert ttft == pytest.approx(queue_prefill, rel=1e-9)
    e2e = delta("vllm:e2e_request_latency_seconds_sum")
    assert e2e == pytest.approx(ttft + delta("vllm:request_decode_time_seconds_sum"), rel=1e-9)


def test_running_plus_waiting_equals_requests_in_the_engine(emu: Emulator) -> None:
    """Freeze the engine with requests in flight; the gauges must count exactly the open streams."""
    host, port = emu.host_port
    socks = []
    try:
        assert emu.json("POST", "/admin/faults", {"paused": True})[0] == 200
        for i in range(5):
            s = socket.create_connection((host, port))
            body = json.dumps({"model": MODEL, "prompt": "hi " * (i + 1), "max_tokens": 50, "ignore_eos": True,
                               "stream": True}).encode()  # fmt: skip
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            socks.append(s)
        emu.wait_for(lambda: emu.json("GET", "/debug/requests")[1]["in_engine"] == 5, what="5 requests in the engine")
        m = emu.metrics()  # one scrape: every gauge below describes the same instant
        running, waiting = m["vllm:num_requests_running"][0].value, m["vllm:num_requests_waiting"][0].value
        assert running + waiting == 5
        by_reason = {s.labels["reason"]: s.value for s in m["vllm:num_requests_waiting_by_reason"]}
        assert by_reason == {"capacity": waiting, "deferred": 0}
        # the first arrival started a step that cannot end while paused (others read in the same loop turn
        # may have joined it); the rest wait for its end
        assert running >= 1
        assert m["vllm:kv_cache_usage_perc"][0].value > 0
    finally:
        emu.json("POST", "/admin/faults", {"paused": False})
        for s in socks:
            s.close()
    # Running and waiting from one scrape: two scrapes could straddle a waiting request's move to running
    # (waiting read after the move, running before it) and see an empty engine that is not.
    last: dict = {}

    def empty() -> bool:
        last.update(emu.metrics())
        return last["vllm:num_requests_running"][0].value + last["vllm:num_requests_waiting"][0].value == 0

    emu.wait_for(empty, 20, what="the aborted streams to leave the engine")
    assert last["vllm:kv_cache_usage_perc"][0].value == 0  # the same scrape: nothing left, no KV held


# ---------------------------------------------------------------------------------------------- preemption
# 16 blocks of 16 tokens. A request holds KV for prompt + output - 1 tokens at most (its last token is
# never fed back). Two requests of 20 prompt tokens (19 words + beginning-of-text) need 2 x 8 = 16 blocks
# with 109 output tokens (128 tokens of KV each), but 2 x 9 = 17 with 110: one more token runs the cache out.


@pytest.fixture(scope="module")
def tiny() -> Iterator[Emulator]:
    e = start_emulator("--model", MODEL, "--num-gpu-blocks", "16", "--max-model-len", "256",
                       "--latency-multiplier", "0.5")  # fmt: skip
    yield e
    e.stop()


def _pair(emu: Emulator, output: int) -> float:
    """Two identical requests admitted together (the engine is paused until both arrived)."""
    before = emu.value("vllm:num_preemptions_total")
    per_request_before = emu.value("vllm:request_num_preemptions_sum")
    emu.json("POST", "/admin/faults", {"paused": True})
    try:
        with ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(complete, emu, 19, output) for _ in range(2)]
            emu.wait_for(lambda: emu.json("GET", "/debug/requests")[1]["in_engine"] == 2, what="both requests")
            emu.json("POST", "/admin/faults", {"paused": False})
            bodies = [f.result() for f in futs]
    finally:
        emu.json("POST", "/admin/faults", {"paused": False})
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert all([b["usage"][k] for k in counts] == [20, output, 20 + output] for b in bodies)
    preempted = emu.value("vllm:num_preemptions_total") - before
    # both finished: the per-request histogram holds every preemption of the engine's counter
    assert emu.value("vllm:request_num_preemptions_sum") - per_request_before == preempted
    return preempted


def test_no_preemption_while_blocks_suffice(tiny: Emulator) -> None:
    assert _pair(tiny, 109) == 0


def test_preemption_when_blocks_run_out(tiny: Emulator) -> None:
    assert _pair(tiny, 110) >= 1
    _, dbg = tiny.json("GET", "/debug/requests")
    rows = [dict(zip(dbg["fields"], r, strict=True)) for r in dbg["rows"]]
    assert any(r["preemptions"] > 0 for r in rows[-2:])
    assert tiny.value("vllm:kv_cache_usage_perc") == 0  # all blocks back once both finished

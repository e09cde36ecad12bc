"""The live Observation's token features, from the gateway in front of the emulator: the footprints of
queued and in-flight requests, the window's output tokens, TPOT and goodput, the engine's preemptions, and
the same figures on /metrics.

The prompts are `n` copies of " hello", which the gateway and the emulator both count as n + 1 tokens
(core/tokens.py), so the queued and prefill footprints are known exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from emulator_helpers import Emulator, start_emulator
from gateway_helpers import ADMIN_TOKEN, GatewayProcess, http, key, tenant_cfg, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

WORDS = 200
PROMPT_TOKENS = WORDS + 1


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    # few KV blocks: four long answers at once cannot all fit, so the engine preempts
    e = start_emulator("--num-gpu-blocks", "96", "--max-num-seqs", "8", "--max-model-len", "1024")
    yield e
    e.stop()


def observation(g: GatewayProcess) -> dict[str, Any]:
    status, body = g.admin("GET", "/admin/observation")
    assert status == 200, body
    return body


def tenants(g: GatewayProcess) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in observation(g)["observation"]["tenants"]}


def send(g: GatewayProcess, tenant: str, max_tokens: int, out: list[int]) -> threading.Thread:
    def go() -> None:
        # with usage at the end, as the load generator asks: the gateway then counts the backend's tokens exactly
        body = {"model": model(g), "prompt": " hello" * WORDS, "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        out.append(http("POST", g.url + "/v1/completions", body, {"Authorization": f"Bearer {key(tenant)}"},
                        timeout=120)[0])

    t = threading.Thread(target=go)
    t.start()
    return t


_MODEL: dict[str, str] = {}


def model(g: GatewayProcess) -> str:
    if g.url not in _MODEL:
        import json

        _MODEL[g.url] = json.loads(http("GET", g.url + "/v1/models", None,
                                        {"Authorization": f"Bearer {key('a')}"})[2])["data"][0]["id"]
    return _MODEL[g.url]


def test_footprints_of_queued_and_running_requests(emu: Emulator, tmp_path: Path) -> None:
    cfg = {"telemetry": {"scrape_interval_s": 0.2, "window_s": 30},
           "tenants": [tenant_cfg("a", limit=1, max_queue=8), tenant_cfg("b", limit=4)]}
    g = GatewayProcess(tmp_path, emu.url, cfg)
    statuses: list[int] = []
    threads: list[threading.Thread] = []
    try:
        threads += [send(g, "a", 600, statuses) for _ in range(3)]  # one runs, two wait in the gateway's queue
        a = wait_for(lambda: (t := tenants(g)["a"])["queue_depth"] == 2 and t["in_flight"] == 1 and t, 60,
                     "one request of a running and two queued")
        assert a["prompt_tokens_queued"] == 2 * PROMPT_TOKENS  # exactly the emulator's count of those prompts
        running = wait_for(lambda: (t := tenants(g)["a"])["tokens_in_flight"] > PROMPT_TOKENS and t, 60,
                           "the running request to stream tokens")
        assert running["prefill_tokens"] == 0  # its first token came
        assert PROMPT_TOKENS < running["tokens_in_flight"] <= PROMPT_TOKENS + 600
        o = observation(g)["observation"]
        assert o["prefill_tokens_waiting"] == sum(t["prefill_tokens"] for t in o["tenants"])
        metrics = g.metrics()
        assert f'admit_gateway_prompt_tokens_queued{{tenant="a"}} {2 * PROMPT_TOKENS}.0' in metrics
        assert 'admit_gateway_tokens_in_flight{tenant="a"}' in metrics
    finally:
        # the queued ones would take minutes: lift the limit so that they all run now
        g.admin("PUT", "/admin/limits", {"limits": {"a": 4}})
        for t in threads:
            t.join(180)
        g.stop()
    assert statuses == [200, 200, 200]


def test_window_tokens_tpot_goodput_and_preemptions(emu: Emulator, tmp_path: Path) -> None:
    slo = {"slo": {"ttft_s": 60, "tpot_s": 5}}  # lenient: every completion is good
    cfg = {"telemetry": {"scrape_interval_s": 0.2, "window_s": 60},
           "tenants": [tenant_cfg("a", limit=8, **slo), tenant_cfg("b", limit=8, slo={"tpot_s": 1e-6})]}
    g = GatewayProcess(tmp_path, emu.url, cfg)
    try:
        statuses: list[int] = []
        threads = [send(g, "a", 300, statuses) for _ in range(4)] + [send(g, "b", 50, statuses)]
        for t in threads:
            t.join(180)
        assert statuses == [200] * 5
        ts = wait_for(lambda: (t := tenants(g))["a"]["completions"] == 4 and t, 30, "the four completions")
        a, b = ts["a"], ts["b"]
        window = observation(g)["observation"]["window_s"]
        assert a["output_tokens_per_s"] == pytest.approx(4 * 300 / window)
        assert 0 < a["tpot_p50"] <= a["tpot_p99"] < 5
        assert a["goodput"] == pytest.approx(4 / window)  # all four within the lenient objectives
        assert b["completions"] == 1 and b["goodput"] == 0  # a TPOT objective no answer can meet
        assert (a["slo_ttft"], a["slo_tpot"], b["slo_tpot"]) == (60, 5, pytest.approx(1e-6))
        assert a["tokens_in_flight"] == 0 and a["prefill_tokens"] == 0  # nothing left in flight
        o = observation(g)["observation"]
        assert o["preemptions"] > 0  # 96 KV blocks cannot hold four 500-token sequences at once
        metrics = g.metrics(ADMIN_TOKEN)
        assert 'admit_gateway_output_tokens_total{tenant="a"} 1200.0' in metrics
        assert 'admit_gateway_good_requests_total{tenant="a"} 4.0' in metrics
        assert 'admit_gateway_good_requests_total{tenant="b"}' not in metrics
    finally:
        g.stop()

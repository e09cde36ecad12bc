"""The gateway in front of the project's emulator (vLLM-compatible, token-engine timing): the official client
streamed and not, and a limit that holds at the backend as the emulator itself reports it."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from emulator_helpers import Emulator, start_emulator
from gateway_helpers import GatewayProcess, key, tenant_cfg, wait_for

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]
MODEL = "emu-model"


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator("--model", MODEL, "--max-model-len", "4096", "--seed", "5", "--latency-multiplier", "1.0")
    yield e
    e.stop()


@pytest.fixture(scope="module")
def gw(emu: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    g = GatewayProcess(tmp_path_factory.mktemp("gw"), emu.url, {"tenants": [tenant_cfg("t", limit=2)]})
    yield g
    g.stop()


def test_openai_client_through_gateway_to_emulator(gw: GatewayProcess) -> None:
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key=key("t"), max_retries=0, timeout=30)
    assert [m.id for m in c.models.list()] == [MODEL]
    r = c.completions.create(model=MODEL, prompt="hello " * 10, max_tokens=5, extra_body={"ignore_eos": True})
    assert r.usage is not None and r.usage.completion_tokens == 5
    parts = [ch.choices[0].delta.content for ch in c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True,
        extra_body={"ignore_eos": True}) if ch.choices and ch.choices[0].delta.content]
    assert len(parts) == 6


def test_limit_holds_at_the_emulator(gw: GatewayProcess, emu: Emulator, tmp_path: Path) -> None:
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key=key("t"), max_retries=0, timeout=60)
    seen: list[float] = []

    def one(_: int) -> int:
        r = c.completions.create(model=MODEL, prompt="x " * 50, max_tokens=40, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens if r.usage else 0

    _, before = emu.json("GET", "/debug/requests")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(one, i) for i in range(8)]
        while not all(f.done() for f in futs):
            # Both gauges from one scrape: two scrapes could straddle a finish and the next admission
            # (running read before the finish, waiting after the next arrival) and count one request twice.
            m = emu.metrics()
            seen.append(m["vllm:num_requests_running"][0].value + m["vllm:num_requests_waiting"][0].value)
        assert [f.result() for f in futs] == [40] * 8
    # Sampled gauges: the emulator never held more than the tenant's limit.
    assert max(seen) <= 2, f"emulator held {max(seen)} at once; samples {seen}"
    # Exactly, from the emulator's own per-request times (arrival at the engine, finish): these 8 requests
    # overlap at most 2 deep — and 2 at some point, so the limit was used, not just respected.
    _, after = emu.json("GET", "/debug/requests")
    f = after["fields"]
    rows = [dict(zip(f, r, strict=True)) for r in after["rows"][len(before["rows"]):]]
    assert len(rows) == 8
    events = sorted([(r["arrival"], 1) for r in rows] + [(r["finished"], -1) for r in rows])
    depth, deepest = 0, 0
    for _, step in events:  # a finish and an arrival at the same instant: the finish counts first (-1 < 1)
        depth += step
        deepest = max(deepest, depth)
    assert deepest == 2, f"requests overlapped {deepest} deep at the emulator: {rows}"
    wait_for(lambda: gw.state()["in_flight"] == 0, 15, "in flight 0")

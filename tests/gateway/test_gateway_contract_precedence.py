"""In the gateway, a tenant's in-contract request is served before the same tenant's queued excess
(core/admission.py's two classes, driven by gateway/local_admission.py), against the mock backend."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from gateway_helpers import CountingMock, GatewayProcess, key, tenant_cfg, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

# 1000 tokens of burst and a refill too slow to matter here (0.01 tokens/s): once a first small request has
# spent a few tokens, a request of more than the burst never fits (excess; only a full envelope lets one
# through) and one of a few tokens always does (in contract), whatever the machine's speed
CONTRACT = {"tokens_per_s": 0.01, "burst": 1000, "attainment": 0.9}
BIG = [1] * 1500  # token ids: the gateway counts them exactly


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    m = CountingMock(itl_ms=10)
    yield m
    m.stop()


async def completion(s: aiohttp.ClientSession, url: str, prompt: object, tokens: int, tag: str) -> int:
    body = {"model": "mock", "prompt": prompt, "max_tokens": tokens, "stream": True}
    headers = {"Authorization": f"Bearer {key('t')}", "x-admit-step-id": tag}
    async with s.post(url + "/v1/completions", json=body, headers=headers) as resp:
        async for _ in resp.content.iter_any():
            pass
        return resp.status


def test_an_arriving_in_contract_request_is_served_before_the_queued_excess(tmp_path: Path,
                                                                            mock: CountingMock) -> None:
    """Limit 1: a holder (excess) takes the slot, two excess requests queue, then an in-contract one arrives.
    When the holder's client leaves, its slot goes to the in-contract request, then to the excess in arrival
    order. With limit 1 each finishes before the next starts, so the request log's lines (one as each request
    finishes) are in service order."""
    g = GatewayProcess(tmp_path, mock.url, {"tenants": [
        tenant_cfg("t", limit=1, max_queue=10, queue_timeout_s=120, contract=CONTRACT)]})

    def depth() -> int:
        return int(g.state()["tenants"]["t"]["queue_depth"])

    async def run() -> list[int]:
        async with aiohttp.ClientSession() as s:
            assert await completion(s, g.url, "x", 2, "first") == 200  # in contract: the envelope is no longer full
            holder = asyncio.ensure_future(completion(s, g.url, "x", 20000, "holder"))  # runs for minutes
            await asyncio.to_thread(wait_for, lambda: g.state()["tenants"]["t"]["in_flight"] == 1, 30, "holder")
            jobs = []
            for n, (prompt, tag) in enumerate(((BIG, "excess-1"), (BIG, "excess-2"), ("x", "in-contract")), 1):
                jobs.append(asyncio.ensure_future(completion(s, g.url, prompt, 2, tag)))
                await asyncio.to_thread(wait_for, lambda n=n: depth() == n, 30, f"{tag} queued")
            holder.cancel()  # the client leaves: the gateway releases the holder's slot
            return await asyncio.gather(*jobs)

    try:
        statuses = asyncio.run(run())
        lines = wait_for(lambda: ls if len(ls := g.request_log()) == 5 else [], 30, "five request-log lines")
    finally:
        g.stop()
    assert statuses == [200, 200, 200]
    assert [(x["step_id"], x["in_contract"], x["outcome"]) for x in lines[:1]] == [("first", True, "ok")]
    holder = [x for x in lines if x["step_id"] == "holder"]
    assert len(holder) == 1 and holder[0]["in_contract"] is False and holder[0]["outcome"] == "client-disconnect"
    served = [(x["step_id"], x["in_contract"], x["outcome"]) for x in lines[1:] if x["step_id"] != "holder"]
    assert served == [("in-contract", True, "ok"), ("excess-1", False, "ok"), ("excess-2", False, "ok")]

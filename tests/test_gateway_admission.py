"""Admission through the gateway, counted at the backend: exact limits, FIFO, queue full, TTL, sharing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from gateway_helpers import CountingMock, GatewayProcess, key, tenant_cfg, wait_for

pytestmark = pytest.mark.timeout(90)


@dataclass
class Answer:
    status: int
    reason: str | None
    retry_after: str | None
    start: float
    first_byte: float | None
    end: float
    tag: str


async def completion(session: aiohttp.ClientSession, url: str, tenant: str, tokens: int, tag: str = "") -> Answer:
    body = {"model": "mock", "prompt": "x", "max_tokens": tokens, "stream": True}
    t0 = time.monotonic()
    first = None
    headers = {"Authorization": f"Bearer {key(tenant)}", "x-admit-step-id": tag}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        async for _ in resp.content.iter_any():
            if first is None:
                first = time.monotonic()
        return Answer(resp.status, resp.headers.get("x-admit-reason"), resp.headers.get("retry-after"), t0, first,
                      time.monotonic(), tag)


async def burst(url: str, jobs: list[tuple[str, int]], gap_s: float = 0.0) -> list[Answer]:
    async with aiohttp.ClientSession() as s:
        tasks = []
        for i, (tenant, tokens) in enumerate(jobs):
            tasks.append(asyncio.ensure_future(completion(s, url, tenant, tokens, f"{tenant}-{i}")))
            if gap_s:
                await asyncio.sleep(gap_s)
        return await asyncio.gather(*tasks)


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    m = CountingMock(itl_ms=10)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def gw(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = {"tenants": [
        tenant_cfg("exact", limit=3, max_queue=100, queue_ttl_s=30),
        tenant_cfg("small", limit=1, max_queue=2, queue_ttl_s=30),
        tenant_cfg("short", limit=1, max_queue=10, queue_ttl_s=0.3),
        tenant_cfg("fifo", limit=1, max_queue=20, queue_ttl_s=30),
        tenant_cfg("grow", limit=1, max_queue=20, queue_ttl_s=30),
    ]}
    g = GatewayProcess(tmp_path_factory.mktemp("gw"), mock.url, cfg)
    yield g
    g.stop()


def drained(gw: GatewayProcess) -> bool:
    st = gw.state()
    return st["in_flight"] == 0 and all(t["queue_depth"] == 0 for t in st["tenants"].values())


def test_limit_is_never_exceeded_at_the_backend(gw: GatewayProcess, mock: CountingMock) -> None:
    wait_for(lambda: mock.counter.now == 0, what="an idle backend")
    mock.counter.reset_max()
    answers = asyncio.run(burst(gw.url, [("exact", 8)] * 15))
    assert [a.status for a in answers] == [200] * 15
    assert mock.counter.max == 3  # the limit is reached (work flows) and never passed
    def lines() -> list[float]:  # a line is written as its request finishes, just after the answer
        got = [x["queue_wait_s"] for x in gw.request_log() if x["tenant"] == "exact"]
        return got if len(got) >= 15 else []

    waits = wait_for(lines, 10, "15 request-log lines")
    assert sum(w > 0.02 for w in waits) >= 10  # 12 of 15 had to wait for a slot
    wait_for(lambda: drained(gw), 5, "in flight 0")


def test_fifo_order_within_a_tenant(gw: GatewayProcess) -> None:
    # arrivals 30 ms apart, each answer takes ~50 ms at limit 1: they are served in arrival order
    answers = asyncio.run(burst(gw.url, [("fifo", 5)] * 8, gap_s=0.03))
    assert all(a.status == 200 for a in answers)
    served = sorted(answers, key=lambda a: a.first_byte or 0)
    assert [a.tag for a in served] == [a.tag for a in answers]


def test_full_queue_defers_with_429_queue_full(gw: GatewayProcess) -> None:
    async def run() -> list[Answer]:
        async with aiohttp.ClientSession() as s:
            long = [asyncio.ensure_future(completion(s, gw.url, "small", 40, f"long-{i}")) for i in range(3)]
            # one runs, two wait: the queue (max 2) is full now
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["small"]["queue_depth"] == 2, 5)
            extra = await completion(s, gw.url, "small", 1, "extra")
            return [extra, *await asyncio.gather(*long)]

    extra, *rest = asyncio.run(run())
    assert extra.status == 429 and extra.reason == "queue-full"
    assert extra.retry_after is not None and int(extra.retry_after) >= 1
    assert [a.status for a in rest] == [200, 200, 200]
    st = gw.state()["tenants"]["small"]
    assert st["queue_full"] == 1 and st["in_flight"] == 0
    assert 'admit_gateway_deferred_total{reason="queue-full",tenant="small"} 1.0' in gw.metrics()


def test_queue_ttl_defers_with_429_ttl_expired(gw: GatewayProcess) -> None:
    async def run() -> tuple[Answer, Answer]:
        async with aiohttp.ClientSession() as s:
            holder = asyncio.ensure_future(completion(s, gw.url, "short", 100, "holder"))  # ~1 s at 10 ms/token
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["short"]["in_flight"] == 1, 5)
            late = await completion(s, gw.url, "short", 1, "late")
            return late, await holder

    late, holder = asyncio.run(run())
    assert holder.status == 200
    assert late.status == 429 and late.reason == "ttl-expired"
    assert 0.25 <= late.end - late.start < 0.9  # dropped at its 0.3 s deadline, not when the slot freed
    line = wait_for(lambda: [x for x in gw.request_log() if x["step_id"] == "late"], what="log line")[0]
    assert line["outcome"] == "ttl-expired" and line["status"] == 429
    assert gw.state()["tenants"]["short"]["ttl_expired"] == 1


def test_raising_a_limit_dispatches_waiting_requests_at_once(gw: GatewayProcess, mock: CountingMock) -> None:
    async def run() -> tuple[list[Answer], float]:
        async with aiohttp.ClientSession() as s:
            jobs = [asyncio.ensure_future(completion(s, gw.url, "grow", 60, f"g{i}")) for i in range(4)]
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["grow"]["queue_depth"] == 3, 5)
            t = time.monotonic()
            status, body = await asyncio.to_thread(gw.admin, "PUT", "/admin/tenants/grow/limit",
                                                   {"limit": 4, "reason": "test"}, actor="pytest")
            assert status == 200, body
            await asyncio.to_thread(wait_for, lambda: mock.counter.now >= 4, 2, "4 streams at the backend")
            took = time.monotonic() - t
            return await asyncio.gather(*jobs), took

    answers, took = asyncio.run(run())
    assert took < 0.5  # the three queued requests went out at once, not one by one (~0.6 s each)
    assert [a.status for a in answers] == [200] * 4
    audit = gw.audit_log()[-1]
    assert (audit["tenant"], audit["old"], audit["new"], audit["actor"], audit["reason"]) == (
        "grow", 1, 4, "pytest", "test")
    assert gw.state()["tenants"]["grow"]["limit"] == 4


def test_client_leaving_the_queue_frees_its_place(gw: GatewayProcess) -> None:
    async def run() -> None:
        async with aiohttp.ClientSession() as s:
            holder = asyncio.ensure_future(completion(s, gw.url, "fifo", 50, "holder"))
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["fifo"]["in_flight"] == 1, 5)
            waiter = asyncio.ensure_future(completion(s, gw.url, "fifo", 1, "leaver"))
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["fifo"]["queue_depth"] == 1, 5)
            waiter.cancel()  # closes the connection while the request is queued
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["fifo"]["queue_depth"] == 0, 3)
            await holder

    asyncio.run(run())
    line = wait_for(lambda: [x for x in gw.request_log() if x["step_id"] == "leaver"], what="log line")[0]
    assert line["outcome"] == "client-disconnect" and line["queue_wait_s"] is None
    wait_for(lambda: drained(gw), 5, "in flight 0")


def test_sharing_borrows_idle_capacity_and_never_passes_it(mock: CountingMock, tmp_path: Path) -> None:
    cfg = {"capacity": 4, "tenants": [
        tenant_cfg("lender", limit=2, max_queue=50),
        tenant_cfg("borrower", limit=2, borrow=2, max_queue=50),
    ]}
    g = GatewayProcess(tmp_path, mock.url, cfg)
    try:
        wait_for(lambda: mock.counter.now == 0, what="an idle backend")
        mock.counter.reset_max()

        async def run() -> tuple[list[Answer], list[Answer]]:
            async with aiohttp.ClientSession() as s:
                b = [asyncio.ensure_future(completion(s, g.url, "borrower", 20, f"b{i}")) for i in range(10)]
                await asyncio.to_thread(wait_for, lambda: mock.counter.now == 4, 5, "borrowing up to capacity")
                assert g.state()["tenants"]["borrower"]["in_flight"] == 4
                lend = [asyncio.ensure_future(completion(s, g.url, "lender", 20, f"l{i}")) for i in range(2)]
                return await asyncio.gather(*b), await asyncio.gather(*lend)

        borrowed, lent = asyncio.run(run())
        assert all(a.status == 200 for a in borrowed + lent)
        assert mock.counter.max == 4  # capacity is the bound, borrowing or not
        # the lender took its guaranteed slots back from the next ones that freed: it did not wait for the
        # borrower's whole backlog (8 more answers of ~0.2 s at 4 at a time)
        first_lender = min(a.first_byte or 0 for a in lent) - min(a.start for a in lent)
        assert first_lender < 0.45
        wait_for(lambda: g.state()["in_flight"] == 0, 5, "in flight 0")
    finally:
        g.stop()

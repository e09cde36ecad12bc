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

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]


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


def offered(gw: GatewayProcess, tenant: str) -> int:
    """Requests of ``tenant`` that reached admission so far, from one snapshot of the gateway's state."""
    t = gw.state()["tenants"][tenant]
    return t["admitted"] + t["queue_depth"] + t["queue_full"] + t["ttl_expired"] + t["cancelled_in_queue"]


async def burst(url: str, jobs: list[tuple[str, int]], paced_by: GatewayProcess | None = None) -> list[Answer]:
    """The jobs at once; or, ``paced_by`` a gateway, each sent once the previous one reached its admission
    (so the order in which they reach the queue is the order they were sent in, however slow the machine)."""
    async with aiohttp.ClientSession() as s:
        tasks = []
        base = {t: await asyncio.to_thread(offered, paced_by, t) for t, _ in jobs} if paced_by else {}
        for i, (tenant, tokens) in enumerate(jobs):
            tasks.append(asyncio.ensure_future(completion(s, url, tenant, tokens, f"{tenant}-{i}")))
            if paced_by is not None:
                base[tenant] += 1
                await asyncio.to_thread(wait_for, lambda t=tenant, n=base[tenant]: offered(paced_by, t) >= n, 20,
                                        f"request {i} at the gateway's admission")
        return await asyncio.gather(*tasks)


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    m = CountingMock(itl_ms=10)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def gw(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = {"tenants": [
        tenant_cfg("exact", limit=3, max_queue=100, queue_timeout_s=30),
        tenant_cfg("small", limit=1, max_queue=2, queue_timeout_s=30),
        tenant_cfg("short", limit=1, max_queue=10, queue_timeout_s=0.3),
        tenant_cfg("fifo", limit=1, max_queue=20, queue_timeout_s=30),
        tenant_cfg("grow", limit=1, max_queue=20, queue_timeout_s=30),
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
    # each sent once the previous one is queued (a fixed gap between sends does not fix the order in which
    # they reach the gateway on a loaded machine); each answer takes ~50 ms at limit 1: served in that order
    answers = asyncio.run(burst(gw.url, [("fifo", 5)] * 8, paced_by=gw))
    assert all(a.status == 200 for a in answers)
    served = sorted(answers, key=lambda a: a.first_byte or 0)
    assert [a.tag for a in served] == [a.tag for a in answers]


def test_full_queue_defers_with_429_queue_full(gw: GatewayProcess) -> None:
    async def run() -> list[Answer]:
        async with aiohttp.ClientSession() as s:
            # ~1.5 s each at 10 ms/token: the queue stays full long enough for `extra` to find it full
            long = [asyncio.ensure_future(completion(s, gw.url, "small", 150, f"long-{i}")) for i in range(3)]
            # one runs, two wait: the queue (max 2) is full now
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["small"]["queue_depth"] == 2, 20)
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
            holder = asyncio.ensure_future(completion(s, gw.url, "short", 300, "holder"))  # ~3 s at 10 ms/token
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["short"]["in_flight"] == 1, 20)
            late = await completion(s, gw.url, "short", 1, "late")
            return late, await holder

    late, holder = asyncio.run(run())
    assert holder.status == 200
    assert late.status == 429 and late.reason == "ttl-expired"
    # dropped at its 0.3 s deadline, not when the slot freed: the holder's ~3 s stream ends well after
    # (a margin of seconds, not of the 0.1 s a 1 s holder left, which a loaded machine can eat)
    assert late.end - late.start >= 0.25
    assert late.end < holder.end - 1.0, (late, holder)
    line = wait_for(lambda: [x for x in gw.request_log() if x["step_id"] == "late"], what="log line")[0]
    assert line["outcome"] == "ttl-expired" and line["status"] == 429
    assert gw.state()["tenants"]["short"]["ttl_expired"] == 1


def test_raising_a_limit_dispatches_waiting_requests_at_once(gw: GatewayProcess, mock: CountingMock) -> None:
    async def run() -> list[Answer]:
        async with aiohttp.ClientSession() as s:
            # ~3 s each at 10 ms/token: the first still runs when the three queued ones go out
            jobs = [asyncio.ensure_future(completion(s, gw.url, "grow", 300, f"g{i}")) for i in range(4)]
            await asyncio.to_thread(wait_for, lambda: gw.state()["tenants"]["grow"]["queue_depth"] == 3, 20)
            status, body = await asyncio.to_thread(gw.admin, "PUT", "/admin/tenants/grow/limit",
                                                   {"limit": 4, "reason": "test"}, actor="pytest")
            assert status == 200, body
            # 4 at the backend together, before any of them finished: not dispatched one per release
            await asyncio.to_thread(wait_for, lambda: mock.counter.now >= 4, 20, "4 streams at the backend")
            return await asyncio.gather(*jobs)

    answers = asyncio.run(run())
    assert [a.status for a in answers] == [200] * 4
    audit = gw.audit_log()[-1]
    assert (audit["tenant"], audit["old"], audit["new"], audit["actor"], audit["reason"]) == (
        "grow", 1, 4, "pytest", "test")
    assert gw.state()["tenants"]["grow"]["limit"] == 4
    # When the three queued requests left the queue, by the gateway's own clock (arrival + queue wait): at
    # the limit change, all of them, not one by one (~3 s apart). Measured inside the gateway, so the
    # round trips of the admin call and of polling the backend (slow on a loaded machine) do not count.
    lines = wait_for(lambda: g if len(g := [x for x in gw.request_log() if x["tenant"] == "grow"]) >= 4 else [],
                     10, "4 request-log lines")
    queued = sorted(lines, key=lambda x: x["queue_wait_s"])[1:]
    left = [x["arrival"] + x["queue_wait_s"] for x in queued]
    assert all(abs(t - audit["time"]) < 0.5 for t in left), (left, audit["time"])


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


BORROW_TOKENS = 150
BORROW_S = BORROW_TOKENS * 0.01  # the mock's 10 ms per token


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
                b = [asyncio.ensure_future(completion(s, g.url, "borrower", BORROW_TOKENS, f"b{i}"))
                     for i in range(10)]
                await asyncio.to_thread(wait_for, lambda: mock.counter.now == 4, 20, "borrowing up to capacity")
                assert g.state()["tenants"]["borrower"]["in_flight"] == 4
                lend = [asyncio.ensure_future(completion(s, g.url, "lender", 20, f"l{i}")) for i in range(2)]
                return await asyncio.gather(*b), await asyncio.gather(*lend)

        borrowed, lent = asyncio.run(run())
        assert all(a.status == 200 for a in borrowed + lent)
        assert mock.counter.max == 4  # capacity is the bound, borrowing or not
        # The lender took its guaranteed slots back from the next ones that freed: its k-th request (in order of
        # admission) got a slot by the k-th borrowed answer that ended after it arrived, not after the borrower's
        # backlog (6 queued when the lender came, 4 at a time: a whole answer, ~1.5 s, later). Checked on the
        # gateway's own clock, from its request log (a borrowed answer ends at arrival + e2e, a lender request
        # is admitted at arrival + queue wait; the two happen in one step when a slot goes to the lender), not
        # from when this busy process saw the first bytes, which a loaded machine delays by more than a second.
        lines = wait_for(lambda: ls if len(ls := g.request_log()) >= 12 else [], 10, "12 request-log lines")
        ends = sorted(x["arrival"] + x["e2e_s"] for x in lines if x["tenant"] == "borrower")
        lender = sorted((x["arrival"] + x["queue_wait_s"], x["arrival"]) for x in lines if x["tenant"] == "lender")
        assert len(ends) == 10 and len(lender) == 2
        for k, (admitted, arrived) in enumerate(lender):
            after = [t for t in ends if t > arrived]
            bound = after[k] if len(after) > k else arrived  # no borrowed answer left to wait for: at once
            assert admitted < bound + BORROW_S / 2, (k, admitted, arrived, ends)
        wait_for(lambda: g.state()["in_flight"] == 0, 20, "in flight 0")
    finally:
        g.stop()

"""Gateway replicas sharing admission state on a real redis-server: the limit holds across replicas (counted
at the backend), and a Redis killed mid-run leaves no slot behind once it is back, failing open or closed
as configured and counting it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import redis
from gateway_helpers import CountingMock, GatewayProcess, key, tenant_cfg, wait_for
from redis_helpers import RedisServer

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    m = CountingMock(itl_ms=25)
    yield m
    m.stop()


async def one(s: aiohttp.ClientSession, url: str, tenant: str, tokens: int) -> tuple[int, str | None]:
    body = {"model": "mock", "prompt": "x", "max_tokens": tokens, "stream": True}
    async with s.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key(tenant)}"}) as r:
        async for _ in r.content.iter_any():
            pass
        return r.status, r.headers.get("x-admit-reason")


async def burst(urls: list[str], n: int, tokens: int) -> list[tuple[int, str | None]]:
    async with aiohttp.ClientSession() as s:
        return await asyncio.gather(*(one(s, urls[i % len(urls)], "a", tokens) for i in range(n)))


def gateway(tmp: Path, mock: CountingMock, rs: RedisServer, mode: str, limit: int = 2,
            wait: bool = True) -> GatewayProcess:
    tmp.mkdir()
    cfg = {"redis": {"url": rs.url, "failure_mode": mode, "lease_ttl_s": 30, "poll_s": 0.05, "timeout_s": 1},
           "tenants": [tenant_cfg("a", limit=limit, max_queue=50, queue_timeout_s=60)]}
    return GatewayProcess(tmp, mock.url, cfg, wait=wait)


def leases(rs: RedisServer) -> int:
    with redis.Redis.from_url(rs.url) as r:
        return int(r.zcard("admit:leases:a"))


def test_two_replicas_never_pass_the_limit_together(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    # both started before waiting for either: side by side, not one after the other (each takes many seconds
    # on a loaded machine; one after the other they once took this test past its time limit)
    g1 = gateway(tmp_path / "g1", mock, rs, "closed", limit=3, wait=False)
    g2 = gateway(tmp_path / "g2", mock, rs, "closed", limit=3, wait=False)
    try:
        g1.ready()
        g2.ready()
        wait_for(lambda: mock.counter.now == 0, what="an idle backend")
        mock.counter.reset_max()
        answers = asyncio.run(burst([g1.url, g2.url], 14, 12))
        assert answers == [(200, None)] * 14
        assert mock.counter.max == 3  # reached (both replicas' requests flowed) and never passed, together
        def ok_lines() -> list[int]:  # a line is written as its request finishes, just after the answer
            n = [len([x for x in g.request_log() if x["outcome"] == "ok"]) for g in (g1, g2)]
            return n if sum(n) >= 14 else []

        served = wait_for(ok_lines, 10, "14 request-log lines")
        assert served == [7, 7]
        # a limit set through one replica's admin API binds the other replica too
        assert g1.admin("PUT", "/admin/limits", {"limits": {"a": 1}})[0] == 200
        wait_for(lambda: g2.state()["tenants"]["a"]["limit"] == 1, 10, "the new limit at the other replica")
        mock.counter.reset_max()
        assert asyncio.run(burst([g1.url, g2.url], 6, 8)) == [(200, None)] * 6
        assert mock.counter.max == 1
        wait_for(lambda: leases(rs) == 0 and g1.state()["in_flight"] == g2.state()["in_flight"] == 0, 10, "drained")
    finally:
        g1.stop()
        g2.stop()


def _outage(gw: GatewayProcess, mock: CountingMock, rs: RedisServer) -> list[tuple[int, str | None]]:
    """Two requests running, Redis killed, three more sent; returns the answers of the three."""

    async def run() -> list[tuple[int, str | None]]:
        async with aiohttp.ClientSession() as s:
            running = [asyncio.ensure_future(one(s, gw.url, "a", 60)) for _ in range(2)]
            await asyncio.to_thread(wait_for, lambda: mock.counter.now == 2, 20, "two requests at the backend")
            assert leases(rs) == 2
            rs.kill()
            late = await asyncio.gather(*(one(s, gw.url, "a", 4) for _ in range(3)))
            assert [await r for r in running] == [(200, None)] * 2  # what ran finishes
            return late

    wait_for(lambda: mock.counter.now == 0, what="an idle backend")
    mock.counter.reset_max()
    late = asyncio.run(run())
    assert mock.counter.max == 2  # a single replica: even failing open, its own count keeps the limit
    st = gw.state()
    assert st["redis"]["up"] is False and st["redis"]["outages"] == 1 and st["redis"]["errors"] >= 1
    assert st["redis"]["pending_releases"] >= 2  # the two releases wait for Redis
    rs.start()
    wait_for(lambda: gw.state()["redis"]["up"] and gw.state()["redis"]["pending_releases"] == 0, 20, "recovery")
    wait_for(lambda: leases(rs) == 0, 10, "no lease left in Redis")  # nothing leaked
    # after the outage the limit is whole again: a burst gets exactly `limit` slots, never more
    mock.counter.reset_max()
    assert asyncio.run(burst([gw.url], 6, 8)) == [(200, None)] * 6
    assert mock.counter.max == 2
    wait_for(lambda: leases(rs) == 0 and gw.state()["in_flight"] == 0, 10, "drained")
    return late


def test_redis_killed_mid_run_fail_closed(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    gw = gateway(tmp_path / "g", mock, rs, "closed")
    try:
        late = _outage(gw, mock, rs)
        assert late == [(503, "admission-unavailable")] * 3
        metrics = gw.metrics()
        assert 'admit_gateway_fail_closed_deferred_total{tenant="a"} 3.0' in metrics
        assert 'admit_gateway_deferred_total{reason="admission-unavailable",tenant="a"} 3.0' in metrics
        assert "admit_gateway_redis_outages_total 1.0" in metrics
        def unavailable() -> list[int]:
            got = [x["status"] for x in gw.request_log() if x["outcome"] == "admission-unavailable"]
            return got if len(got) >= 3 else []

        assert wait_for(unavailable, 10, "three request-log lines") == [503] * 3
    finally:
        gw.stop()


def test_redis_killed_mid_run_fail_open(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    gw = gateway(tmp_path / "g", mock, rs, "open")
    try:
        t0 = time.monotonic()
        late = _outage(gw, mock, rs)
        assert late == [(200, None)] * 3  # admitted on the replica's own count, after the running two
        assert time.monotonic() - t0 < 60
        st = gw.state()
        assert st["tenants"]["a"]["fail_open_admitted"] == 3
        assert st["redis"]["recoveries"] == 1
        assert 'admit_gateway_fail_open_admitted_total{tenant="a"} 3.0' in gw.metrics()
    finally:
        gw.stop()

"""Chaos on loopback, bounded in time: the backend dies and comes back while clients misbehave.

About 6 s of mixed traffic from two tenants: well-behaved streamed and plain requests, clients that leave
mid-stream, slow readers with a tiny receive buffer, malformed and oversize bodies and wrong keys; the
backend is crashed (every connection reset) after 1.5 s and listens again 1.5 s later. Afterwards:

* every request the test sent has a terminal result at the client and exactly one request-log line,
* nothing is in flight anywhere: the gateway's slots and queues, its request tasks, the backend's streams,
* no 5xx of the gateway's own making: the only 5xx is 503 ``no-backend``, answered while the backend was
  down, and the gateway logged no unhandled exception.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from gateway_helpers import CountingMock, GatewayProcess, key, tenant_cfg, wait_for

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

DURATION_S = 6.0
KILL_AT, RESTART_AT = 1.5, 3.0
RATE = 30.0  # requests per second, all kinds together


@dataclass
class Outcome:
    tag: str
    kind: str
    status: int | None  # None: the client left on purpose before the status line
    start: float
    end: float


@pytest.fixture()
def mock() -> Iterator[CountingMock]:
    m = CountingMock(itl_ms=5)
    yield m
    m.stop()


def _body(rng: random.Random, stream: bool) -> dict[str, object]:
    return {"model": "mock", "prompt": "chaos " * rng.randint(1, 20), "max_tokens": rng.randint(5, 60),
            "stream": stream}


async def _raw(
    url: str, request: bytes, rcvbuf: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(request)
    await writer.drain()
    return reader, writer


def _http_request(tenant_key: str, tag: str, body: bytes) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + tenant_key.encode()
            + b"\r\nx-admit-step-id: " + tag.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


async def _one(kind: str, tag: str, url: str, session: aiohttp.ClientSession, rng: random.Random,
               t0: float) -> Outcome:
    start = time.monotonic() - t0
    tenant = rng.choice(["red", "blue"])
    headers = {"Authorization": f"Bearer {key(tenant)}", "x-admit-step-id": tag}
    status: int | None = None
    if kind in ("stream", "plain", "malformed", "oversize", "wrong-key"):
        data: bytes
        if kind == "malformed":
            data = b'{"model": "mock", "prompt": '
        elif kind == "oversize":
            data = json.dumps({"model": "mock", "prompt": "x" * 6000}).encode()
        else:
            data = json.dumps(_body(rng, kind == "stream")).encode()
        if kind == "wrong-key":
            headers["Authorization"] = "Bearer sk-wrong-" + str(rng.random())
        headers["Content-Type"] = "application/json"
        try:
            async with session.post(url + "/v1/completions", data=data, headers=headers) as resp:
                status = resp.status
                await resp.read()
        except aiohttp.ClientPayloadError:
            pass  # a stream cut by the backend's crash: the status line had come
    elif kind == "leave":
        reader, writer = await _raw(url, _http_request(key(tenant), tag, json.dumps(
            {"model": "mock", "prompt": "x", "max_tokens": 400, "stream": True}).encode()))
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
            status = int(head.split()[1])
            if status == 200:
                await asyncio.wait_for(reader.readuntil(b"data:"), 10)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.transport.abort()
    elif kind == "slow":
        reader, writer = await _raw(url, _http_request(key(tenant), tag, json.dumps(
            {"model": "mock", "prompt": "x", "max_tokens": 80, "stream": True}).encode()), rcvbuf=2048)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 15)
        status = int(head.split()[1])
        while await reader.read(512):
            await asyncio.sleep(0.01)
        writer.close()
    return Outcome(tag, kind, status, start, time.monotonic() - t0)


KINDS = ["stream"] * 6 + ["plain"] * 3 + ["leave"] * 2 + ["slow", "malformed", "oversize", "wrong-key"]


@dataclass
class Crash:
    """When the backend went down and came back, on the test's clock (since t0) and on the wall clock."""

    began: float = -1.0  # just before the crash was asked for: no answer can be 'no-backend' before this
    restarted: float = -1.0  # once the backend listens again
    began_wall: float = -1.0
    restarted_wall: float = -1.0


async def _chaos(url: str, mock: CountingMock) -> tuple[list[Outcome | BaseException], Crash]:
    rng = random.Random(6)
    t0 = time.monotonic()
    tasks = []
    crash = Crash()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        i = 0
        send_at = 0.0  # a schedule, not sleeps: a slow loop sends late (and catches up), never fewer requests
        while send_at < DURATION_S:
            now = time.monotonic() - t0
            if send_at > now:
                await asyncio.sleep(send_at - now)
                now = time.monotonic() - t0
            if crash.began < 0 and now >= KILL_AT:
                crash.began, crash.began_wall = time.monotonic() - t0, time.time()
                await asyncio.to_thread(mock.crash)
            if crash.restarted < 0 and now >= RESTART_AT:
                await asyncio.to_thread(mock.restart)
                crash.restarted, crash.restarted_wall = time.monotonic() - t0, time.time()
            kind = rng.choice(KINDS)
            tasks.append(asyncio.ensure_future(
                asyncio.wait_for(_one(kind, f"c{i}-{kind}", url, session, rng, t0), 30)))
            i += 1
            send_at += rng.expovariate(RATE)
            await asyncio.sleep(0)  # let the new request start (and draw from rng) before the next draw
        results = await asyncio.gather(*tasks, return_exceptions=True)
    return list(results), crash


def test_chaos_leaves_no_request_unfinished_and_no_slot_behind(mock: CountingMock, tmp_path) -> None:
    cfg = {"max_body_bytes": 4096, "tenants": [
        tenant_cfg("red", limit=4, max_queue=30, queue_timeout_s=2.0),
        tenant_cfg("blue", limit=3, max_queue=5, queue_timeout_s=1.0,
                   envelopes=[{"target": "*", "requests_per_s": 8, "request_burst": 10}]),
    ]}
    g = GatewayProcess(tmp_path, mock.url, cfg)
    try:
        results, crash = asyncio.run(_chaos(g.url, mock))
        assert crash.began >= 0 and crash.restarted > crash.began
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[:3]  # every request reached a terminal state at the client, none hung
        outcomes = [r for r in results if isinstance(r, Outcome)]
        assert len(outcomes) > 100

        # in flight 0 everywhere
        def drained() -> dict | None:  # one snapshot: in flight, in progress and queues read together
            st = g.state()
            return st if st["in_flight"] == 0 and st["requests_in_progress"] == 0 else None

        st = wait_for(drained, 20, "the gateway to drain")
        assert all(t["queue_depth"] == 0 for t in st["tenants"].values())
        wait_for(lambda: mock.counter.now == 0, 20, "the backend to drain")

        # one log line per request, each with a terminal status
        lines = wait_for(lambda: (ls := g.request_log()) and len(ls) >= len(outcomes) and ls, 20, "log lines")
        by_tag: dict[str, list[dict[str, object]]] = {}
        for line in lines:
            by_tag.setdefault(str(line["step_id"]), []).append(line)
        for o in outcomes:
            got = by_tag.get(o.tag, [])
            assert len(got) == 1, (o, got)
            assert got[0]["status"] and got[0]["outcome"], got[0]
            if o.status is not None and o.kind not in ("leave",):
                assert got[0]["status"] == o.status or got[0]["outcome"] == "backend-broken", (o, got[0])

        # no 5xx of our own making; 503 no-backend only while the backend was down: answered after the crash
        # began, to a request sent before the backend listened again ...
        for o in outcomes:
            if o.status is not None and o.status >= 500:
                assert o.status == 503, o
                assert crash.began <= o.end and o.start <= crash.restarted, (o, crash)
        # ... and decided by the gateway (its own clock: arrival + e2e) by a moment after the backend was back.
        # On the gateway's clock, not this process's, which runs the backend, the clients and the crash: its
        # stalls delay when the test sees an answer, not when the gateway gave it.
        for line in lines:
            if int(line["status"]) >= 500:  # type: ignore[call-overload]
                assert line["outcome"] == "no-backend", line
                answered = float(line["arrival"]) + float(line["e2e_s"])  # type: ignore[arg-type]
                assert crash.began_wall <= answered <= crash.restarted_wall + 1.0, (line, crash)
        kinds = {o.kind: set() for o in outcomes}
        for o in outcomes:
            kinds[o.kind].add(o.status)
        assert kinds["malformed"] == {400} and kinds["oversize"] == {413} and kinds["wrong-key"] == {401}
        assert 200 in kinds["stream"] and 200 in kinds["slow"]
        seen = {str(line["outcome"]) for line in lines}
        # the chaos did happen: streams were cut by the crash or found no backend, clients left mid-stream
        assert {"client-disconnect", "ok"} <= seen and seen & {"backend-broken", "no-backend"}
        stderr = g.stderr()
        assert "Traceback" not in stderr and "Exception in ASGI" not in stderr, stderr[-3000:]
    finally:
        g.stop()

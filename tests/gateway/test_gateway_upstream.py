"""The gateway's pooled HTTP/1.1 client against real loopback servers that misbehave on purpose.

Each server is a plain asyncio TCP server whose handler answers raw bytes, so the tests control exactly
what reaches the client: keep-alive reuse, a pooled connection the server closed, silence, bodies
delimited by the end of the connection, truncated bodies, refused connections.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest
from admit.gateway.upstream import BackendBroken, BackendTimeout, NoBackend, Upstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await r.readexactly(length) if length else b"")


async def _serve(handler: Handler) -> tuple[asyncio.Server, list[int]]:
    conns: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(len(conns))
        try:
            await handler(r, w, conns[-1])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    return server, conns


def _url(server: asyncio.Server) -> str:
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


def test_keep_alive_connections_are_reused_and_chunked_bodies_arrive_whole() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, _: int) -> None:
        while True:
            req = await _read_request(r)
            if b"/stream" in req:
                w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            else:
                w.write(OK)
            await w.drain()

    async def main() -> None:
        server, conns = await _serve(handler)
        up = Upstream(_url(server), 5)
        await up.start()
        for i in range(20):
            resp = await up.request("POST", "/stream" if i % 2 else "/v1/completions", b'{"a":1}')
            assert resp.status == 200
            body = await resp.read()
            assert body == (b"hello world" if i % 2 else b'{"ok":true}')
            assert resp.done
            resp.release()
        assert len(conns) == 1  # one connection carried all twenty
        await up.close()
        server.close()

    run(main())


def test_a_pooled_connection_the_backend_closed_is_retried_once_on_a_fresh_one() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        await _read_request(r)
        w.write(OK)
        await w.drain()
        if n == 0:  # the first connection is kept by the client, then dropped by us without a word
            await r.readuntil(b"\r\n\r\n")

    async def main() -> None:
        server, conns = await _serve(handler)
        up = Upstream(_url(server), 5)
        await up.start()
        for _ in range(3):
            resp = await up.request("POST", "/v1/completions", b"{}")
            assert await resp.read() == b'{"ok":true}'
            resp.release()
        assert len(conns) == 3  # the reused connection died unanswered: retried on a fresh one each time
        await up.close()
        server.close()

    run(main())


def test_nothing_answers_is_no_backend() -> None:
    async def closes(r: asyncio.StreamReader, w: asyncio.StreamWriter, _: int) -> None:
        await _read_request(r)  # read the request, then close without answering

    async def main() -> None:
        server, conns = await _serve(closes)
        up = Upstream(_url(server), 5)
        await up.start()
        with pytest.raises(NoBackend, match="closed the connection"):
            await up.request("POST", "/v1/completions", b"{}")
        assert len(conns) == 2  # tried, then retried once
        server.close()
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        refused = Upstream(f"http://127.0.0.1:{port}", 5)
        await refused.start()
        with pytest.raises(NoBackend, match="cannot connect"):
            await refused.request("POST", "/v1/completions", b"{}")

    run(main())


def test_silence_is_a_timeout_and_a_short_body_is_broken() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, _: int) -> None:
        req = await _read_request(r)
        if b"/short" in req:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a part")
            await w.drain()
        elif b"/until-close" in req:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end")
            await w.drain()
            return
        await r.read()  # silent until the client gives up

    async def main() -> None:
        server, _ = await _serve(handler)
        up = Upstream(_url(server), 0.3)
        await up.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(BackendTimeout):
            await up.request("POST", "/silent", b"{}")
        assert 0.25 <= loop.time() - t0 < 5
        resp = await up.request("POST", "/short", b"{}")
        with pytest.raises(BackendBroken):
            await resp.read()
        resp.close()
        resp = await up.request("POST", "/until-close", b"{}")
        assert resp.length is None and await resp.read() == b"to the end"
        resp.release()
        assert not up._idle  # a body delimited by the close leaves nothing to reuse
        server.close()

    run(main())


def test_a_slow_reader_pauses_the_backend() -> None:
    size = 64 << 20  # far more than the kernel buffers on loopback
    sent: list[int] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, _: int) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        block = b"x" * (64 << 10)
        for _ in range(size // len(block)):
            w.write(block)
            await w.drain()  # blocks while the client does not read
            sent.append(len(block))

    async def main() -> None:
        server, _ = await _serve(handler)
        up = Upstream(_url(server), 5)
        await up.start()
        resp = await up.request("GET", "/big", None)
        first = await resp.next_chunk()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        last = -1
        while sum(sent) != last:  # wait until the server is stuck in drain(), with a deadline
            last = sum(sent)
            await asyncio.sleep(0.2)
            assert loop.time() < deadline, "the backend never blocked"
        assert sum(sent) < size  # the client stopped reading: the backend could not send it all
        got = len(first)
        while chunk := await resp.next_chunk():
            got += len(chunk)
        assert got == size
        resp.release()
        await up.close()
        server.close()

    run(main())

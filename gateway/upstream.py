"""The pooled async HTTP/1.1 client towards the backend, with the gateway's error mapping.

A small client written for this one job: keep-alive connections to one backend (an unbounded pool —
admission, not the pool, bounds concurrency), each an `asyncio.Protocol` whose responses are parsed with
httptools (the parser uvicorn uses on the other side). A request is written in one ``transport.write``;
the response's status and headers come as one object and its body as the byte strings the backend sent
(de-chunked), with no decompression and no per-request session, connector or header objects. It replaced
aiohttp's client, which spent several times as much CPU per proxied request (docs/BENCHMARKS.md, "Gateway").

Bodies pass through untouched (``Accept-Encoding`` is not sent, so the backend answers in identity
encoding). A connection that fails before any response byte arrives is retried once on a fresh connection
(a pooled keep-alive connection may have been closed by a restarted backend); if that fails too, or a
connection cannot be opened at all, the backend is unreachable: `NoBackend` (the gateway answers 503).
Silence longer than ``timeout_s`` before the response head is `BackendTimeout` (504); during the body it,
a reset connection or bad HTTP is `BackendBroken`. A slow client pauses reading from the backend once
``_HIGH_WATER`` bytes are buffered, so backpressure reaches the backend.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from urllib.parse import urlsplit

import httptools

_HIGH_WATER = 1 << 18  # buffered body bytes at which reading from the backend pauses
_IDLE_S = 30.0  # a pooled connection idle for longer is closed instead of reused
_CONNECT_S = 5.0


class NoBackend(Exception):
    """No backend answered: connection refused, reset or closed before the response headers."""


class BackendTimeout(Exception):
    """The backend accepted the request but sent nothing for longer than the configured timeout."""


class BackendBroken(Exception):
    """The backend broke off a response (reset, bad HTTP, or silent for too long mid-body)."""


class Response:
    """One response: ``status``, ``headers`` (lower-case names, as sent) and the body as it arrives.

    Read the body with ``await next_chunk()`` (``b""`` at the end) or ``await read()``; then ``release()``
    (the connection goes back to the pool when the body was read to its end) or ``close()`` (drop it).
    """

    __slots__ = ("_conn", "headers", "length", "status")

    def __init__(self, conn: _Conn, status: int, headers: list[tuple[bytes, bytes]], length: int | None) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self.length = length  # the backend's Content-Length, None when it did not send one

    @property
    def done(self) -> bool:
        """The whole body has arrived and been read: the next ``next_chunk()`` would return ``b""``."""
        c = self._conn
        return c._complete and not c._body

    async def next_chunk(self) -> bytes:
        return await self._conn.next_chunk()

    async def read(self) -> bytes:
        parts = []
        while chunk := await self._conn.next_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def take_buffered(self) -> bytes:
        """The body bytes that have arrived and not been read yet, taken without waiting for more (the end of
        an answer that is being dropped: what the backend sent before it was cut off)."""
        body = self._conn._body
        data = b"".join(body)
        body.clear()
        return data

    def release(self) -> None:
        self._conn.release()

    def close(self) -> None:
        self._conn.abort()


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, pool: Upstream) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: Response | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._complete = False
        self._got_bytes = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._until_close = False
        self._keep_alive = False
        self._active = False

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's transport is a Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._active:
            self.pool._forget(self)
            return
        if self._head is not None and self._until_close and not self._complete:
            self._complete = True  # a body delimited by the end of the connection
        elif not self._complete and self._error is None:
            self._error = (BackendBroken if self._got_bytes else _Lost)("the backend closed the connection")
        self._wake()

    def data_received(self, data: bytes) -> None:
        if not self._active or self._complete:  # bytes nobody asked for: out of step, drop the connection
            self.abort()
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._error = BackendBroken(f"bad HTTP from the backend ({exc})")
            self.abort()
            self._wake()

    def pause_writing(self) -> None:  # a request body larger than the socket buffer: the kernel catches up
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer; the real head follows
            self._headers = []
            return
        self._keep_alive = self._parser.should_keep_alive()  # llhttp forgets it once the message is complete
        length: int | None = None
        chunked = False
        for k, v in self._headers:
            if k == b"content-length":
                length = int(v) if v.strip().isdigit() else None
            elif k == b"transfer-encoding":
                chunked = True
        self._until_close = length is None and not chunked and status not in (204, 304)
        self._head = Response(self, status, self._headers, length)
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._head is None:
            return
        self._complete = True
        self._wake()

    # -- the request -----------------------------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self.loop.create_future()
        timer = self.loop.call_later(self.pool.timeout_s, self._expire, self._waiter)
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._waiter = None

    @staticmethod
    def _expire(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(TimeoutError())

    async def request(self, data: bytes) -> Response:
        self._reset()
        self._active = True
        self.transport.write(data)  # type: ignore[union-attr]  # the pool hands out connected connections only
        while self._head is None:
            if self._error is not None:
                raise self._error
            try:
                await self._wait()
            except TimeoutError:
                self.abort()
                raise BackendTimeout(f"no answer from the backend within {self.pool.timeout_s:g} s") from None
        return self._head

    async def next_chunk(self) -> bytes:
        while True:
            if self._body:
                body = self._body
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                self._buffered = 0
                if self._paused and not self.closed:
                    self._paused = False
                    self.transport.resume_reading()  # type: ignore[union-attr]  # paused => connected
                return data
            if self._complete:
                return b""
            if self._error is not None:
                raise BackendBroken(str(self._error)) from None
            try:
                await self._wait()
            except TimeoutError:
                self.abort()
                raise BackendBroken(f"the backend was silent for {self.pool.timeout_s:g} s mid-answer") from None

    def release(self) -> None:
        """After the response: back to the pool if it was read to its end on a reusable connection."""
        if not self._active:
            return
        self._active = False
        if self._complete and not self._body and not self.closed and self._keep_alive:
            self.idle_since = time.monotonic()
            self.pool._idle.append(self)
        else:
            self.abort()

    def abort(self) -> None:
        self._active = False
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()


class _Lost(Exception):
    """A connection closed before any byte of the answer: worth one retry on a fresh connection."""


class Upstream:
    def __init__(self, base_url: str, timeout_s: float, api_key: str | None = None) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        host = self.host if ":" not in self.host else f"[{self.host}]"
        authority = host if parts.port is None else f"{host}:{self.port}"
        head = f"Host: {authority}\r\nAccept: */*\r\n"
        if api_key:
            head += f"Authorization: Bearer {api_key}\r\n"
        self._head = head.encode("latin-1")
        self.timeout_s = timeout_s
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start(), on the loop
        self._idle: collections.deque[_Conn] = collections.deque()
        self._ssl: ssl.SSLContext | None = None
        self._started = False

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.tls:
            self._ssl = ssl.create_default_context()
        self._started = True

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()
        self._started = False

    def _forget(self, conn: _Conn) -> None:
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    async def _connect(self) -> _Conn:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Conn(self), self.host, self.port, ssl=self._ssl),
                _CONNECT_S,
            )
        except TimeoutError:
            raise NoBackend(f"cannot connect to the backend (no answer within {_CONNECT_S:g} s)") from None
        except OSError as exc:
            raise NoBackend(f"cannot connect to the backend ({exc.strerror or exc})") from None
        return conn

    def _pooled(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > _IDLE_S:
                conn.abort()
                continue
            return conn
        return None

    async def request(self, method: str, path: str, body: bytes | None) -> Response:
        """Send one request; the caller reads the response and must ``release()`` or ``close()`` it."""
        assert self._started, "Upstream.start() was not called"
        line = f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1")
        if body is None:
            data = line + self._head + b"\r\n"
        else:
            data = b"%s%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
                line, self._head, len(body), body)
        for attempt in (0, 1):
            conn = (self._pooled() if attempt == 0 else None) or await self._connect()
            try:
                return await conn.request(data)
            except _Lost as exc:
                conn.abort()
                if attempt:
                    raise NoBackend(f"the backend closed the connection ({exc})") from None
            except BackendBroken as exc:
                conn.abort()
                raise NoBackend(f"the backend broke off before answering ({exc})") from None
            except BaseException:
                conn.abort()
                raise
        raise NoBackend("unreachable")  # pragma: no cover

"""A minimal HTTP/1.1 keep-alive client connection that reads OpenAI-style SSE streams.

One :class:`Connection` carries one request at a time. Every ``data_received`` call is stamped with
``time.monotonic_ns()`` before any parsing, so a token's time is when its bytes reached the process.
The parser understands ``Content-Length``, chunked transfer coding and read-until-close bodies; SSE
events are split on a blank line (``\\n\\n``) and only events that mention ``usage`` are JSON-decoded,
which keeps the per-token cost to a few byte searches.

An :class:`Attempt` is one try at one scheduled request. When its response ends (or fails), the
connection calls ``owner.on_attempt_done(connection, attempt, now_ns, reason)`` where ``reason`` is
``None`` for a well-formed 200 stream and otherwise names what went wrong (see :data:`REASONS`).
"""

from __future__ import annotations

import asyncio
import json
from time import monotonic_ns
from typing import Protocol

REASONS = {
    "connect_error": "the TCP (or TLS) connection could not be opened",
    "connection_closed": "the server closed the connection before the response ended",
    "timeout": "no complete response within the request timeout",
    "bad_http": "the response was not valid HTTP/1.1",
    "http_<code>": "the server answered with a non-200 status (e.g. http_429, http_503)",
    "not_streamed": "a 200 answer that was not an event stream",
    "malformed_sse": "an SSE event that was not `data: <json>` or whose usage JSON did not parse",
    "stream_error": "the stream carried an error event",
    "incomplete_stream": "the stream ended without `data: [DONE]`",
    "no_tokens": "the stream finished without any content token",
    "throttled_client": "rejected by the client's own adaptive throttle (not sent)",
}

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _LENGTH, _UNTIL_CLOSE = range(7)
_MAX_ERROR_BODY = 4096


class Owner(Protocol):
    def on_attempt_done(self, conn: Connection, attempt: Attempt, now: int, reason: str | None) -> None: ...

    def on_connection_lost(self, conn: Connection) -> None: ...


class Attempt:
    """One try at a scheduled request; the parser fills in the response fields."""

    __slots__ = (
        "attempt",
        "done",
        "index",
        "malformed",
        "output_tokens",
        "prompt_tokens",
        "retry_after",
        "sched",
        "send",
        "status",
        "stream_error",
        "tenant",
        "times",
    )

    def __init__(self, index: int, tenant: int, sched: int, attempt: int = 0) -> None:
        self.index = index
        self.tenant = tenant
        self.sched = sched
        self.attempt = attempt
        self.reset()

    def reset(self) -> None:
        self.send = 0
        self.status = 0
        self.times: list[int] = []
        self.done = False
        self.malformed = False
        self.stream_error = False
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.retry_after: float | None = None


class Connection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection; see the module docstring."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.cur: Attempt | None = None
        self.closed = False
        self._reset_parser()

    def _reset_parser(self) -> None:
        self.buf = b""
        self.state = _HEAD
        self.left = 0
        self.keep_alive = True
        self.sse = b""
        self.is_stream = False
        self.body = b""

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        a = self.cur
        if a is not None:
            now = monotonic_ns()
            if self.state == _UNTIL_CLOSE:
                self._feed_body(self.buf, now)
                self.buf = b""
                self._finish(now)
            else:
                self.cur = None
                self.owner.on_attempt_done(self, a, now, "connection_closed")
        self.owner.on_connection_lost(self)

    def data_received(self, data: bytes) -> None:
        now = monotonic_ns()
        if self.cur is None:  # bytes nobody asked for: the stream is out of step
            self.abort()
            return
        self.buf += data
        try:
            self._parse(now)
        except (ValueError, IndexError):
            self._fail(now, "bad_http")

    # -- requests ---------------------------------------------------------------------------------
    def send(self, attempt: Attempt, data: bytes) -> None:
        self.cur = attempt
        self._reset_parser()
        attempt.send = monotonic_ns()
        self.transport.write(data)  # type: ignore[union-attr]

    def abort(self) -> None:
        self.keep_alive = False
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def fail_current(self, now: int, reason: str) -> None:
        """End the current attempt with ``reason`` and drop the connection (used for timeouts)."""
        if self.cur is not None:
            self._fail(now, reason)

    def _fail(self, now: int, reason: str) -> None:
        a = self.cur
        self.cur = None
        self.keep_alive = False
        if self.transport is not None and not self.closed:
            self.transport.abort()
        if a is not None:
            self.owner.on_attempt_done(self, a, now, reason)

    # -- parsing ----------------------------------------------------------------------------------
    def _parse(self, now: int) -> None:
        """Advance the state machine over ``self.buf`` with an index; the buffer is cut once at the end."""
        buf = self.buf
        pos = 0
        n = len(buf)
        try:
            while self.cur is not None and pos < n:
                st = self.state
                if st == _CHUNK_SIZE:
                    end = buf.find(b"\r\n", pos)
                    if end < 0:
                        break
                    size = int(buf[pos:end].split(b";", 1)[0], 16)
                    pos = end + 2
                    if size == 0:
                        self.state = _TRAILER
                    else:
                        self.left = size
                        self.state = _CHUNK_DATA
                elif st == _CHUNK_DATA:
                    stop = min(n, pos + self.left)
                    self.left -= stop - pos
                    self._feed_body(buf[pos:stop], now)
                    pos = stop
                    if self.left == 0:
                        self.state = _CHUNK_CRLF
                elif st == _CHUNK_CRLF:
                    if n - pos < 2:
                        break
                    if buf[pos : pos + 2] != b"\r\n":
                        raise ValueError("chunk not followed by CRLF")
                    pos += 2
                    self.state = _CHUNK_SIZE
                elif st == _HEAD:
                    end = buf.find(b"\r\n\r\n", pos)
                    if end < 0:
                        if n - pos > 65536:
                            raise ValueError("header too long")
                        break
                    head = buf[pos:end]
                    pos = end + 4
                    self._head(head)
                elif st == _TRAILER:
                    end = buf.find(b"\r\n", pos)
                    if end < 0:
                        break
                    trailer_empty = end == pos
                    pos = end + 2
                    if trailer_empty:
                        self.buf = buf[pos:]
                        self._finish(now)
                        return
                elif st == _LENGTH:
                    stop = min(n, pos + self.left)
                    self.left -= stop - pos
                    self._feed_body(buf[pos:stop], now)
                    pos = stop
                    if self.left == 0:
                        self.buf = buf[pos:]
                        self._finish(now)
                        return
                else:  # _UNTIL_CLOSE
                    self._feed_body(buf[pos:], now)
                    pos = n
        finally:
            if self.cur is not None or self.state != _HEAD:
                self.buf = buf[pos:]

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0]
        if not status_line.startswith(b"HTTP/1."):
            raise ValueError("not an HTTP/1.x status line")
        a = self.cur
        a.status = status = int(status_line[9:12])  # type: ignore[union-attr]
        length = -1
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                if b"close" in value.lower():
                    self.keep_alive = False
            elif name == b"content-type":
                self.is_stream = b"text/event-stream" in value.lower()
            elif name == b"retry-after":
                try:
                    a.retry_after = float(value.strip())  # type: ignore[union-attr]
                except ValueError:
                    a.retry_after = 1.0  # an HTTP date: back off one second  # type: ignore[union-attr]
        if status_line.startswith(b"HTTP/1.0"):
            self.keep_alive = False
        if chunked:
            self.state = _CHUNK_SIZE
        elif length >= 0:
            self.left = length
            self.state = _LENGTH
            if length == 0:
                self._finish(monotonic_ns())
        elif status in (204, 304) or 100 <= status < 200:
            self._finish(monotonic_ns())
        else:
            self.keep_alive = False
            self.state = _UNTIL_CLOSE

    def _feed_body(self, piece: bytes, now: int) -> None:
        a = self.cur
        if a is None:
            return
        if a.status != 200 or not self.is_stream:
            if len(self.body) < _MAX_ERROR_BODY:
                self.body += piece[: _MAX_ERROR_BODY - len(self.body)]
            return
        if b"\r" in piece:  # some servers end SSE lines with CRLF
            piece = piece.replace(b"\r\n", b"\n")
        sse = self.sse + piece if self.sse else piece
        start = 0
        while True:
            end = sse.find(b"\n\n", start)
            if end < 0:
                break
            self._event(a, sse[start:end], now)
            start = end + 2
        self.sse = sse[start:]

    @staticmethod
    def _event(a: Attempt, ev: bytes, now: int) -> None:
        if ev.startswith(b"data:"):
            p = ev[5:].strip()
        else:
            data = [ln[5:].strip() for ln in ev.replace(b"\r", b"").split(b"\n") if ln.startswith(b"data:")]
            if not data:
                ok = all(
                    ln.startswith((b":", b"event:", b"id:", b"retry:")) or not ln.strip() for ln in ev.split(b"\n")
                )
                if not ok:
                    a.malformed = True
                return
            p = b"\n".join(data)
        if p == b"[DONE]":
            a.done = True
            return
        if p[:1] != b"{" or p[-1:] != b"}":
            a.malformed = True
            return
        if p.startswith(b'{"error"') or b'"object":"error"' in p:
            a.stream_error = True
            return
        if b'"usage":{' in p or b'"usage": {' in p:
            try:
                obj = json.loads(p)
            except ValueError:
                a.malformed = True
                return
            usage = obj.get("usage")
            if isinstance(usage, dict):
                a.output_tokens = int(usage.get("completion_tokens") or 0)
                a.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            if not obj.get("choices"):
                return
        if b'"content":""' in p or b'"text":""' in p or b'"content":null' in p:
            return  # a role-only or finish-only event carries no token
        a.times.append(now)

    def _finish(self, now: int) -> None:
        a = self.cur
        self.cur = None
        self.state = _HEAD
        if a is None:
            return
        reason: str | None = None
        if a.status != 200:
            reason = f"http_{a.status}"
        elif not self.is_stream:
            reason = "not_streamed"
        elif a.stream_error:
            reason = "stream_error"
        elif a.malformed:
            reason = "malformed_sse"
        elif not a.done:
            reason = "incomplete_stream"
        elif not a.times:
            reason = "no_tokens"
        if self.buf and self.keep_alive:  # pipelined leftovers cannot belong to us
            self.keep_alive = False
        self.owner.on_attempt_done(self, a, now, reason)

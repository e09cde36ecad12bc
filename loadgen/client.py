"""A minimal HTTP/1.1 keep-alive client connection that reads OpenAI-style SSE streams.

One :class:`Connection` carries one request at a time. Every ``data_received`` call is stamped with
``time.monotonic_ns()`` before any parsing, so a token's time is when its bytes reached the process.
The parser understands ``Content-Length``, chunked transfer coding and read-until-close bodies. The body
bytes of one read are de-chunked in one pass and scanned once: SSE events are split on a blank line
(``\\n\\n``); runs of plain one-line ``data: {…}`` events are only counted with byte searches, and only
events that may be special (usage, error, empty delta, ``[DONE]``) are looked at one by one. The usage
event's two counts are read with a pattern, falling back to a JSON decode when it does not match. The
attempt keeps, per read that carried tokens, its arrival time (``times``) and token count (``counts``).

A request sent with ``stream=False`` expects a non-streamed answer: its body is kept whole (up to
``_MAX_JSON_BODY``), the time its first byte arrived is the attempt's one entry in ``times``, and at the
end its ``usage`` is read (the same pattern, else a JSON decode); the token count is the one entry in
``counts``.

An :class:`Attempt` is one try at one scheduled request. When its response ends (or fails), the
connection calls ``owner.on_attempt_done(connection, attempt, now_ns, reason)`` where ``reason`` is
``None`` for a well-formed 200 stream and otherwise names what went wrong (see :data:`REASONS`).
"""

from __future__ import annotations

import asyncio
import json
import re
from time import monotonic_ns
from typing import Protocol

REASONS = {
    "connect_error": "the TCP (or TLS) connection could not be opened",
    "connection_closed": "the server closed the connection before the response ended",
    "timeout": "no complete response within the request timeout",
    "bad_http": "the response was not valid HTTP/1.1",
    "http_<code>": "the server answered with a non-200 status (e.g. http_429, http_503)",
    "not_streamed": "a 200 answer that was not an event stream",
    "bad_json": "a non-streamed 200 answer that was not a JSON completion (an object with 'choices')",
    "malformed_sse": "an SSE event that was not `data: <json>` or whose usage JSON did not parse",
    "stream_error": "the stream carried an error event",
    "incomplete_stream": "the stream ended without `data: [DONE]`",
    "no_tokens": "the stream finished without any content token",
    "throttled_client": "rejected by the client's own adaptive throttle (not sent)",
}

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _LENGTH, _UNTIL_CLOSE = range(7)
_MAX_ERROR_BODY = 4096
_MAX_JSON_BODY = 1 << 22  # bytes of a non-streamed answer kept (to read its usage)
# byte strings that may make an SSE event something other than a plain content token: such events are
# parsed one by one, the rest of a read is only counted
_MARKERS = (b'"usage"', b'"error"', b'"content":""', b'"text":""', b'"content":null', b"[DONE]", b"\n\n\n")


# parsed response heads: a server sends the same few heads again and again (its Date header changes
# once a second), so each distinct head is parsed once
_HEADS: dict[bytes, tuple[int, int, bool, bool, bool, float | None]] = {}
_HEADS_MAX = 256
# a flat usage object whose counts are plain integers, completion before or after prompt tokens
_USAGE = re.compile(
    rb'"usage": ?\{(?=[^{}]*"completion_tokens": ?(\d+)[,}])(?=[^{}]*"prompt_tokens": ?(\d+)[,}])[^{}]*\}'
)


def _parse_head(head: bytes) -> tuple[int, int, bool, bool, bool, float | None]:
    """``(status, content_length or -1, chunked, connection_close, event_stream, retry_after)``."""
    lines = head.split(b"\r\n")
    status_line = lines[0]
    if not status_line.startswith(b"HTTP/1."):
        raise ValueError("not an HTTP/1.x status line")
    status = int(status_line[9:12])
    length = -1
    chunked = close = is_stream = False
    retry_after: float | None = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            if b"close" in value.lower():
                close = True
        elif name == b"content-type":
            is_stream = b"text/event-stream" in value.lower()
        elif name == b"retry-after":
            try:
                retry_after = float(value.strip())
            except ValueError:
                retry_after = 1.0  # an HTTP date: back off one second
    if status_line.startswith(b"HTTP/1.0"):
        close = True
    return status, length, chunked, close, is_stream, retry_after


def _json_answer(a: Attempt, body: bytes) -> str | None:
    """Read a non-streamed answer's token counts into ``a``; a reason when it is not a JSON completion."""
    if not a.times or not body.lstrip().startswith(b"{") or b'"choices"' not in body:
        return "bad_json"
    m = _USAGE.search(body)
    if m is not None and body.count(b'"usage"') == 1:
        a.output_tokens, a.prompt_tokens = int(m.group(1)), int(m.group(2))
    else:
        try:
            obj = json.loads(body)
        except ValueError:
            return "bad_json"
        if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
            return "bad_json"
        usage = obj.get("usage")
        if isinstance(usage, dict):
            a.output_tokens = int(usage.get("completion_tokens") or 0)
            a.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    a.counts.append(max(1, a.output_tokens))
    return None


class Owner(Protocol):
    def on_attempt_done(self, conn: Connection, attempt: Attempt, now: int, reason: str | None) -> None: ...

    def on_connection_lost(self, conn: Connection) -> None: ...


class Attempt:
    """One try at a scheduled request; the parser fills in the response fields."""

    __slots__ = (
        "attempt",
        "counts",
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
        self.counts: list[int] = []
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
        self.expect_stream = True
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
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's transport is a Transport

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
    def send(self, attempt: Attempt, data: bytes, stream: bool = True) -> None:
        self.cur = attempt
        self.expect_stream = stream
        self._reset_parser()
        attempt.send = monotonic_ns()
        self.transport.write(data)  # type: ignore[union-attr]  # the pool hands out connected connections only

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
        """Advance the state machine over ``self.buf`` with an index; the buffer is cut once at the end.

        The body bytes of one read are collected and handed to the SSE scanner once (all stamped
        ``now``); runs of complete chunks are de-chunked in one tight loop.
        """
        buf = self.buf
        pos = 0
        n = len(buf)
        body: list[bytes] = []
        try:
            while self.cur is not None and pos < n:
                st = self.state
                if st == _CHUNK_SIZE:
                    find = buf.find
                    startswith = buf.startswith
                    while True:
                        end = find(b"\r\n", pos)
                        if end < 0:
                            break
                        try:
                            size = int(buf[pos:end], 16)
                        except ValueError:  # a chunk extension (";name=value") or garbage
                            size = int(buf[pos:end].split(b";", 1)[0], 16)
                        if size <= 0:
                            if size < 0:
                                raise ValueError("negative chunk size")
                            pos = end + 2
                            self.state = _TRAILER
                            break
                        stop = end + 2 + size
                        if stop + 2 > n:  # the chunk continues in a later read
                            pos = end + 2
                            self.left = size
                            self.state = _CHUNK_DATA
                            break
                        if not startswith(b"\r\n", stop):
                            raise ValueError("chunk not followed by CRLF")
                        body.append(buf[end + 2 : stop])
                        pos = stop + 2
                    if self.state == _CHUNK_SIZE:
                        break
                elif st == _CHUNK_DATA:
                    stop = min(n, pos + self.left)
                    self.left -= stop - pos
                    body.append(buf[pos:stop])
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
                        if body:
                            self._feed_body(b"".join(body), now)
                        self._finish(now)
                        return
                elif st == _LENGTH:
                    stop = min(n, pos + self.left)
                    self.left -= stop - pos
                    body.append(buf[pos:stop])
                    pos = stop
                    if self.left == 0:
                        self.buf = buf[pos:]
                        self._feed_body(b"".join(body), now)
                        self._finish(now)
                        return
                else:  # _UNTIL_CLOSE
                    body.append(buf[pos:])
                    pos = n
            if body:
                self._feed_body(body[0] if len(body) == 1 else b"".join(body), now)
        finally:
            if self.cur is not None or self.state != _HEAD:
                self.buf = buf[pos:]

    def _head(self, head: bytes) -> None:
        parsed = _HEADS.get(head)
        if parsed is None:
            parsed = _parse_head(head)
            if len(_HEADS) >= _HEADS_MAX:
                _HEADS.clear()
            _HEADS[head] = parsed
        status, length, chunked, close, is_stream, retry_after = parsed
        a = self.cur
        # cur is set: data_received drops bytes that arrive without a request (no check on the hot path)
        a.status = status  # type: ignore[union-attr]
        a.retry_after = retry_after  # type: ignore[union-attr]
        self.is_stream = is_stream
        if close:
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
        """Scan body bytes for complete SSE events; the read's token events are stamped ``now`` together."""
        a = self.cur
        if a is None:
            return
        if not self.expect_stream and a.status == 200:
            if not a.times:
                a.times.append(now)  # the answer's first byte
            if len(self.body) < _MAX_JSON_BODY:
                self.body += piece
            return
        if a.status != 200 or not self.is_stream:
            if len(self.body) < _MAX_ERROR_BODY:
                self.body += piece[: _MAX_ERROR_BODY - len(self.body)]
            return
        sse = self.sse + piece if self.sse else piece
        if b"\r" in sse:  # some servers end SSE lines with CRLF (a CR may end the previous read)
            sse = sse.replace(b"\r\n", b"\n")
        cut = sse.rfind(b"\n\n")
        if cut < 0:
            self.sse = sse
            return
        self.sse = sse[cut + 2 :]
        k = self._events(a, sse[:cut])
        if k:
            a.times.append(now)
            a.counts.append(k)

    @classmethod
    def _events(cls, a: Attempt, block: bytes) -> int:
        """Token events among the ``\\n\\n``-separated events of ``block``.

        Events that may be special (usage, errors, empty deltas, ``[DONE]``, odd blank lines) go one by
        one through :meth:`_event`; the stretches between them are counted with a few byte searches.
        """
        tokens = 0
        while True:
            i = -1
            for marker in _MARKERS:
                j = block.find(marker)
                if j >= 0 and (i < 0 or j < i):
                    i = j
            if i < 0:
                return tokens + cls._plain_events(a, block)
            s = block.rfind(b"\n\n", 0, i)
            if s >= 0:
                tokens += cls._plain_events(a, block[:s])
                s += 2
            else:
                s = 0
            e = block.find(b"\n\n", i)
            if e < 0:
                return tokens + cls._event(a, block[s:])
            tokens += cls._event(a, block[s:e])
            block = block[e + 2 :]

    @classmethod
    def _plain_events(cls, a: Attempt, block: bytes) -> int:
        """Count events that are all one-line ``data: {…}``; anything else is parsed event by event."""
        k = block.count(b"\n\n") + 1
        if (
            block.count(b"\n") == 2 * (k - 1)
            and block.endswith(b"}") + block.count(b"}\n\n") == k
            and (
                block.startswith(b"data: {")
                + block.count(b"\n\ndata: {")
                + block.startswith(b"data:{")
                + block.count(b"\n\ndata:{")
            )
            == k
        ):
            return k
        return sum(cls._event(a, ev) for ev in block.split(b"\n\n"))

    @staticmethod
    def _event(a: Attempt, ev: bytes) -> int:
        """Parse one SSE event fully; 1 if it carries a content token, else 0."""
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
                return 0
            p = b"\n".join(data)
        if p == b"[DONE]":
            a.done = True
            return 0
        if p[:1] != b"{" or p[-1:] != b"}":
            a.malformed = True
            return 0
        if p.startswith(b'{"error"') or b'"object":"error"' in p:
            a.stream_error = True
            return 0
        if b'"usage":{' in p or b'"usage": {' in p:
            m = _USAGE.search(p)
            if m is not None and p.count(b'"usage"') == 1 and p.count(b'"choices"') == 1:
                # the usual final event: read the two counts without decoding the JSON
                a.output_tokens = int(m.group(1))
                a.prompt_tokens = int(m.group(2))
                has_choices = b'"choices":[]' not in p and b'"choices": []' not in p
            else:
                try:
                    obj = json.loads(p)
                except ValueError:
                    a.malformed = True
                    return 0
                usage = obj.get("usage")
                if isinstance(usage, dict):
                    a.output_tokens = int(usage.get("completion_tokens") or 0)
                    a.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                has_choices = bool(obj.get("choices"))
            if not has_choices:
                return 0
        if b'"content":""' in p or b'"text":""' in p or b'"content":null' in p:
            return 0  # a role-only or finish-only event carries no token
        return 1

    def _finish(self, now: int) -> None:
        a = self.cur
        self.cur = None
        self.state = _HEAD
        if a is None:
            return
        reason: str | None = None
        if a.status != 200:
            reason = f"http_{a.status}"
        elif not self.expect_stream:
            reason = _json_answer(a, self.body)
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

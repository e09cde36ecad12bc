"""A small HTTP/1.1 server on asyncio protocols: keep-alive, pipelining, JSON answers and chunked streams.

Why not an ASGI stack: at 500 streams the emulator writes one event per token, over ten thousand a
second, and on a 2-core machine every microsecond per event counts. Here a request is parsed from the
connection's buffer and handed to a synchronous handler; a streamed answer is plain ``transport.write``
calls of pre-framed chunks, with no task, queue or ASGI message per event. docs/emulator.md has the
measurement against Starlette on uvicorn.

Limits: request heads up to 64 KiB (431 otherwise), bodies up to 16 MiB with a ``Content-Length``
(413 otherwise; chunked request bodies get 501). A head must end within ``head_timeout_s`` of its first
byte (408 otherwise, and the connection is closed), so that a client trickling a head cannot hold a
connection for ever; the clock runs only while the server waits for that head, so a head pipelined behind
an answer starts it when the answer ends. A handler answers with :meth:`Connection.respond`, or with
:meth:`Connection.start_stream`, any number of :meth:`Connection.write` and one
:meth:`Connection.end_stream`; requests pipelined behind it wait until it is done, and once
``PIPELINE_BUFFER`` bytes of them wait, the connection stops reading until the answer ends (as uvicorn
does), so a client cannot queue unbounded bytes behind a long stream. Errors of these limits are JSON
in the emulator's shape (``{"error": {"message", "type", "param", "code"}}``). When the peer goes away, the
connection's ``on_close`` callback (set by the handler of a streamed or pending answer) runs.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024
HEAD_TIMEOUT_S = 10.0
PIPELINE_BUFFER = 64 * 1024  # bytes read ahead while an answer is in progress; past it, reading pauses
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable"}  # fmt: skip


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names
    body: bytes


class Handler(Protocol):
    def handle(self, req: HttpRequest, conn: Connection) -> None: ...


def _head(status: int, content_type: str, length: int | None, keep_alive: bool, extra: tuple[str, ...]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", f"Content-Type: {content_type}"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if not keep_alive:
        lines.append("Connection: close")
    lines.extend(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Connection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, handler: Handler, head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        self.handler = handler
        self.head_timeout_s = head_timeout_s
        self.transport: asyncio.Transport | None = None
        self.on_close: Callable[[], object] | None = None  # its result is ignored
        self.closed = False
        self._buf = b""
        self._busy = False  # an answer is in progress
        self._parsing = False
        self._keep_alive = True
        self._continued = False  # sent "100 Continue" for the request being received
        self._deadline: asyncio.TimerHandle | None = None  # of the head being waited for (armed only if it is late)
        self._paused = False  # reading paused: PIPELINE_BUFFER bytes wait behind an answer

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # tokens are small writes: no Nagle delay

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self._busy:
            self._parse()
        elif len(self._buf) > PIPELINE_BUFFER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        cb, self.on_close = self.on_close, None
        if cb is not None:
            cb()

    # ---------------------------------------------------------------- answers
    def respond(self, status: int, body: bytes, content_type: str = "application/json",
                extra_headers: tuple[str, ...] = ()) -> None:  # fmt: skip
        if not self.closed and self.transport is not None:
            self.transport.write(_head(status, content_type, len(body), self._keep_alive, extra_headers) + body)
        self._done()

    def start_stream(self, status: int = 200, content_type: str = "text/event-stream",
                     extra_headers: tuple[str, ...] = ("Cache-Control: no-cache",)) -> None:  # fmt: skip
        self.write(_head(status, content_type, None, self._keep_alive, extra_headers))

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def end_stream(self, data: bytes) -> None:
        """Write the last bytes of a streamed answer (they must end the chunked body)."""
        self.write(data)
        self._done()

    def _done(self) -> None:
        self._busy = False
        self.on_close = None
        if not self._keep_alive:
            if self.transport is not None:
                self.transport.close()
            return
        if self._paused and not self.closed and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        if self._buf and not self._parsing and not self.closed:
            # a pipelined request waits for the next loop turn, so that an answer finished from inside the
            # engine loop never starts another request's handling there
            asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        if not self._busy and not self.closed:
            self._parse()

    def _fail(self, status: int, message: str) -> None:
        """Answer a request that could not be parsed, then close the connection."""
        self._disarm()
        self._keep_alive = False
        self._buf = b""
        err = {"message": message, "type": "BadRequestError", "param": None, "code": status}
        self.respond(status, json.dumps({"error": err}).encode())

    # ---------------------------------------------------------------- parsing
    def _parse(self) -> None:
        self._parsing = True
        try:
            while not self._busy and self._buf and not self.closed:
                if not self._parse_one():
                    return
        finally:
            self._parsing = False

    def _parse_one(self) -> bool:
        """Parse and dispatch one request; False when more bytes are needed (or the connection failed)."""
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self._fail(431, f"request head larger than {MAX_HEAD} bytes")
            elif self._deadline is None:  # a head that did not come whole: from now on it has a deadline
                self._deadline = asyncio.get_running_loop().call_later(self.head_timeout_s, self._head_expired)
            return False
        if self._deadline is not None:
            self._disarm()
        if end > MAX_HEAD:  # a head that came whole in one read is bounded too
            self._fail(431, f"request head larger than {MAX_HEAD} bytes")
            return False
        lines = buf[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._fail(400, "malformed request line")
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                self._fail(400, "malformed header line")
                return False
            headers[name.lower()] = value.strip()
        if "transfer-encoding" in headers:
            self._fail(501, "chunked request bodies are not supported; send Content-Length")
            return False
        try:
            length = int(headers.get("content-length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            self._fail(400, "bad Content-Length")
            return False
        if length > MAX_BODY:
            self._fail(413, "request body too large")
            return False
        start = end + 4
        if len(buf) < start + length:
            if headers.get("expect", "").lower() == "100-continue" and not self._continued:
                self._continued = True  # curl waits for this before sending a large body
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return False
        self._continued = False
        body = buf[start : start + length]
        self._buf = buf[start + length :]
        conn_hdr = headers.get("connection", "").lower()
        self._keep_alive = conn_hdr != "close" if version == "HTTP/1.1" else conn_hdr == "keep-alive"
        path, _, query = target.partition("?")
        self._busy = True
        self.handler.handle(HttpRequest(method, path, query, headers, body), self)
        return True

    # ---------------------------------------------------------------- the head deadline
    def _head_expired(self) -> None:
        self._deadline = None
        if not self._busy and not self.closed:
            self._fail(408, f"request head took longer than {self.head_timeout_s:g} s")

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


async def serve(handler: Handler, host: str, port: int, backlog: int = 4096,
                head_timeout_s: float = HEAD_TIMEOUT_S) -> asyncio.Server:
    """Listen on ``host:port`` (port 0 = any free port) with ``handler`` answering every request."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(handler, head_timeout_s), host, port, backlog=backlog)
    return server

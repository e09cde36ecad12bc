"""Bounds on every client connection, below the ASGI app: head size, deadlines (head, body, write), idle time, count.

uvicorn's httptools protocol buffers a request head of any size (one 256 MB header grew the gateway by
half a gigabyte), has no deadline for a head or a body, and keeps a connection that never sends a byte
open for ever. `guarded_protocol` returns a subclass of that protocol which adds, per connection:

* **head size** — bytes of a request head (request line + headers) are counted as they arrive; past
  ``max_head_bytes`` the connection is answered ``431 head-too-large`` and closed before the parser buffers
  more. The count starts at 0 at the end of each message; a pipelined head that starts inside the same read
  as the previous message's end is counted from the next read, so it may reach twice the bound (memory
  stays bounded);
* **head deadline** — from the first byte of a head to its end, ``head_timeout_s``: ``408 head-timeout``.
  The empty lines HTTP allows before a request line count as the head's first bytes (the parser begins no
  message for them, so they would otherwise hold a connection with no deadline at all);
* **body deadline** — from the end of the head to the end of the body, ``body_timeout_s``. If the app has
  not answered yet, the guard answers ``408 body-timeout`` and marks the request's scope (``SCOPE_CLOSED``)
  so that the app, whose body read then ends, logs it as such; if it has, the connection is just closed;
* **deadlines pause with reading** — uvicorn stops reading a connection (``FlowControl.pause_reading``)
  while a pipelined request waits for the answer before it, or while a body it has buffered waits for the
  app; a head or body left half-read at that moment is late because of the gateway, not the client. The
  deadline stops while reading is paused and runs on with the time it had left when reading resumes. A
  client that pipelines and does not read its answers is thus held up by its own answers (memory stays
  bounded: the gateway reads nothing more from it), not cut off because its next head was half-read; the
  write deadline bounds how long it may leave them unread;
* **write deadline** — when more is queued for a client than its transport buffers (the buffer over its
  high-water mark: asyncio calls ``pause_writing``, and uvicorn stops writing to it, then reading from it),
  or when a closed transport still holds bytes it must send before it lets the connection go, the client
  must take some of them within ``write_timeout_s``. Each period ends with a look at the bytes it has not
  acknowledged (the transport's buffer and the kernel's send queue, SIOCOUTQ on Linux; nothing is written
  while writing is paused, so the figure falls only as the client takes bytes): if it fell, another period
  begins, so a slow reader that keeps reading is never cut, even while the kernel refills the buffer too
  seldom for ``resume_writing`` (which stops the deadline) to come within a period. A client that took
  nothing for a whole period is cut with a TCP reset, ``write-timeout`` (nothing can be answered to a
  client that reads nothing; the reset makes the kernel drop what it held for it at once). The app sees
  the disconnect: a request in progress is cancelled, its lease given back, its upstream closed, and it is
  logged once, as any request whose client left (``client-disconnect``, 499). Without this deadline a
  client that stops reading keeps its connection for ever, since a request in progress (a keyless client's
  401 waiting to be written, or a tenant's stream) is never closed to make room, and a tenant's client
  keeps its lease;
* **idle time** — a connection with no request in progress is closed after ``idle_timeout_s``, from its
  opening (before its first request) as after each answer (keep-alive);
* **connection count** — at ``max_connections`` open connections, a new one first closes another to make
  room (below); only when none may be closed is the new one answered ``503 too-many-connections`` and
  closed, so its file descriptor is free at once.

Which connection makes room, in this order:

1. one that is owed nothing, the one longest in that state: idle after an answer (nginx reuses keep-alive
   connections so when it runs short), or answered while its body was still arriving — a client answered at
   once (a 401 without a key, a 404) whose declared body then trickles in; that body is read only to be
   discarded, so closing it loses nothing. Closed silently, ``evicted-idle``;
2. otherwise one still waiting for its request's head, the one waiting longest: a head begun longest ago
   (measured from its first byte), or a connection opened without sending a byte yet (from its opening).
   One with part of a head is answered ``408 evicted-slow`` (the status of a request that did not arrive
   in time: this one was the slowest when the gateway needed its place); one with none is closed silently,
   ``evicted-idle``. A new connection is itself waiting for its head until its first read, which is why it
   ranks here and not with the idle ones: clients that reconnect as soon as their slow head is evicted
   would otherwise evict every newcomer before its request is read, while here a newcomer is the youngest
   and the last to go.

Never closed to make room: a connection with a request in progress — its answer being prepared or
streamed, requests pipelined behind it, or a body the app is reading. The app reads a body only once it has
identified the tenant (or the admin), so a body still arriving unanswered belongs to a client with a key,
whose slow upload must not be cut by anonymous newcomers; ``body_timeout_s`` bounds it, and
``write_timeout_s`` bounds one whose client stops reading its answer.

Every answer here is the gateway's JSON error shape (gateway/asgi.py), parser errors included (uvicorn
answers those in plain text), and every event reaches ``on_event(event, status)``, which the gateway counts
and logs. A deadline timer is armed only when a read leaves a head or a body incomplete, so a request that
arrives in one read (most do) costs a few attribute checks (docs/BENCHMARKS.md, "Connection guards"); the
time a head began is read from the clock only then too. The write deadline costs nothing per read or write:
it is armed from asyncio's ``pause_writing`` callback and from a close that leaves bytes buffered (one
``is_closing`` check per answer), and reads the kernel's queue only when it is armed and when it expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import math
import resource
import socket
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

# set in a request's ASGI scope when the guard answered it (or closed it) while the app was reading its body
SCOPE_CLOSED = "admit.closed_by_guard"

EventHook = Callable[[str, int | None], None]  # (event, status answered or None)


@dataclass(frozen=True)
class Bounds:
    max_connections: int
    max_head_bytes: int
    head_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    write_timeout_s: float
    send_buffer_bytes: int | None = None  # SO_SNDBUF of each connection; None: the kernel's autotuning


def default_max_connections() -> int:
    """Client connections allowed by default: what the open-file limit leaves after the backend's connections
    (one per admitted request at most), Redis, logs and the event loop's own descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1_000_000
    return max(16, min(soft // 2, soft - 128))


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (as Go's runtime and nginx's worker_rlimit_nofile do);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # pragma: no cover - a platform that refuses; keep what we have
            pass
    return soft


def error_response(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 answer in the gateway's JSON error shape that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error" if status < 500 else
                                 "service_unavailable", "code": reason}, "reason": reason},
                      separators=(",", ":")).encode()
    return b"".join([
        STATUS_LINE[status],
        b"content-type: application/json\r\n",
        b"x-admit-reason: ", reason.encode(), b"\r\n",
        b"content-length: ", str(len(body)).encode(), b"\r\n",
        b"connection: close\r\n\r\n",
        body,
    ])


_HEAD_TOO_LARGE = "head-too-large"
_HEAD_TIMEOUT = "head-timeout"
_BODY_TIMEOUT = "body-timeout"
_TOO_MANY = "too-many-connections"
_BAD_HTTP = "bad-http"
_EVICTED_IDLE = "evicted-idle"
_EVICTED_SLOW = "evicted-slow"
_WRITE_TIMEOUT = "write-timeout"
# the kernel's count of bytes sent on a TCP socket and not yet acknowledged (SIOCOUTQ on Linux; None elsewhere)
_OUTQ = getattr(termios, "TIOCOUTQ", None)


def _unacked(transport: asyncio.Transport) -> int:
    """Bytes written to a connection that its client has not acknowledged: the transport's buffer and, on
    Linux, the kernel's send queue. No write is made while writing is paused, so meanwhile the figure falls
    exactly as the client takes bytes; the kernel moving bytes from the buffer to its queue leaves it as it is."""
    n = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if _OUTQ is not None and sock is not None:
        with contextlib.suppress(OSError, ValueError):
            n += struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
    return n


def _fix_send_buffer(transport: asyncio.Transport, size: int) -> None:
    """Set a connection's kernel send buffer, which also stops the kernel from growing it."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


_LINGER_0 = struct.pack("ii", 1, 0)


def _reset(transport: asyncio.Transport) -> None:
    """Abort a connection with a TCP reset: the kernel drops what it still holds for the client at once instead
    of keeping it (up to megabytes) for a client that does not read (nginx's reset_timedout_connection)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
    transport.abort()


class _Flow(FlowControl):
    """uvicorn's flow control of one connection, which also tells the guard when reading stops and resumes."""

    def __init__(self, transport: asyncio.Transport, paused: Callable[[], None], resumed: Callable[[], None]) -> None:
        super().__init__(transport)
        self._paused = paused
        self._resumed = resumed

    def pause_reading(self) -> None:
        if not self.read_paused:
            super().pause_reading()
            self._paused()

    def resume_reading(self) -> None:
        if self.read_paused:
            super().resume_reading()
            self._resumed()


def guarded_protocol(bounds: Bounds, on_event: EventHook) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the bounds of the module docstring (pass it as ``Config(http=...)``)."""

    class GuardedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = bounds.idle_timeout_s  # type: ignore[assignment]  # uvicorn types it int
            # per connection: bytes of the head being read, whether a head is being read, heads read so far,
            # the deadline armed and, while reading is paused, the time it had left; when the head being read
            # began and when the connection last became idle (loop time); whether it was refused at the door
            self._head_bytes = 0
            self._in_head = True
            self._heads = 0
            self._phase = 0  # of the message being read: 0 none, 1 its head, 2 its body
            self._armed = 0  # the phase the deadline armed covers (0: none armed)
            self._deadline: asyncio.TimerHandle | None = None
            self._left: float | None = None
            self._idle_since = self._head_since = self.loop.time()
            self._refused = False
            # the write deadline (module docstring) and the unacknowledged bytes when it was last armed
            self._write_deadline: asyncio.TimerHandle | None = None
            self._unsent = 0

        # ------------------------------------------------------------- opening and closing
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
            full = len(self.connections) >= bounds.max_connections and not _make_room(self.connections)
            super().connection_made(transport)
            if bounds.send_buffer_bytes is not None:
                _fix_send_buffer(transport, bounds.send_buffer_bytes)
            self.flow = _Flow(transport, self._reading_paused, self._reading_resumed)
            if full:
                self._refused = True
                self._answer(503, _TOO_MANY, "the gateway has as many client connections as it allows; retry later")
                return
            # idle before the first request: uvicorn arms this timer only after an answer
            self.timeout_keep_alive_task = self.loop.call_later(bounds.idle_timeout_s, self.timeout_keep_alive_handler)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._write_stop()
            super().connection_lost(exc)

        def _answer(self, status: int, reason: str, message: str, app_logs: bool = False) -> None:
            """Write a JSON error and close; ``app_logs``: the request reached the app, which writes its line."""
            on_event(reason, None if app_logs else status)
            if not self.transport.is_closing():
                self.transport.write(error_response(status, reason, message))
                self.transport.close()
                self._linger()

        # ------------------------------------------------------------- making room (module docstring)
        def _room_rank(self) -> tuple[int, float] | None:
            """(0, since) owed nothing, (1, since) waiting for its head, None for a connection never closed to
            make room; the lowest is closed first."""
            if self._refused or self.pipeline or self.transport.is_closing():
                return None
            if self.cycle is not None and not self.cycle.response_complete:
                return None  # a request in progress
            if self._phase == 1:
                return 1, self._head_since
            if self._phase == 2 or self._heads:  # answered: idle, or reading the rest of a body to discard it
                return 0, self._idle_since
            return 1, self._idle_since  # opened, and no byte yet

        def _make_room(self) -> None:
            self.connections.discard(self)  # counted as gone now; the transport closes on the next loop turn
            self._disarm()
            if self._phase == 1:
                self._answer(408, _EVICTED_SLOW, "the gateway is at its connection limit and this request head had "
                             "been arriving longer than any other; send a request head in one piece")
            else:
                on_event(_EVICTED_IDLE, None)
                self.transport.close()
                self._linger()

        # ------------------------------------------------------------- bytes in
        def data_received(self, data: bytes) -> None:
            self._feed(data)
            # a deadline only for a head or body still incomplete after this read: a request that arrives in
            # one read (most do) arms no timer at all
            if self._phase != self._armed and not self.transport.is_closing():
                self._disarm()
                self._armed = self._phase
                if self._phase == 1:
                    self._head_since = self.loop.time()
                    self._arm(bounds.head_timeout_s)
                elif self._phase == 2:
                    self._arm(bounds.body_timeout_s)

        def _feed(self, data: bytes) -> None:
            if not self._in_head:
                super().data_received(data)
                return
            # a head's first bytes may be the empty lines allowed before a request line, for which the parser
            # begins no message: they start the head (and its deadline) all the same
            self._phase = 1
            room = bounds.max_head_bytes - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                super().data_received(data)
                return
            # more than the head may still take: feed what fits; if the head ends inside it, the rest is body
            self._head_bytes = bounds.max_head_bytes
            heads = self._heads
            super().data_received(data[:room])
            if self.transport.is_closing():
                return
            if self._heads == heads:  # the head that did not fit has not ended
                self._disarm()
                self._answer(431, _HEAD_TOO_LARGE, f"the request head is larger than {bounds.max_head_bytes} bytes")
                return
            self._feed(data[room:])

        def send_400_response(self, msg: str) -> None:
            self._disarm()
            self._answer(400, _BAD_HTTP, "the request is not valid HTTP/1.1")

        # ------------------------------------------------------------- parser callbacks
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._phase = 1

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._heads += 1
            self._phase = 2
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            self._in_head = True
            self._head_bytes = 0
            self._phase = 0
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self._idle_since = self.loop.time()
            super().on_response_complete()
            if self.transport.is_closing():  # uvicorn closed it after this answer (Connection: close)
                self._linger()

        def shutdown(self) -> None:
            super().shutdown()
            if self.transport.is_closing():
                self._linger()

        # ------------------------------------------------------------- deadlines
        def _arm(self, delay: float) -> None:
            """Start the deadline of the phase ``_armed`` names, ``delay`` s from now; while reading is paused,
            only keep the time it has left."""
            if self.flow.read_paused:
                self._left = delay
            else:
                self._deadline = self.loop.call_later(delay, self._head_expired if self._armed == 1 else
                                                      self._body_expired)

        def _disarm(self) -> None:
            self._armed = 0
            self._left = None
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _reading_paused(self) -> None:
            if self._deadline is not None:
                self._left = max(0.0, self._deadline.when() - self.loop.time())
                self._deadline.cancel()
                self._deadline = None

        def _reading_resumed(self) -> None:
            if self._left is not None and not self.transport.is_closing():
                left, self._left = self._left, None
                self._arm(left)

        def _head_expired(self) -> None:
            self._deadline = None
            self._armed = 0
            if self.cycle is None or self.cycle.response_complete:
                self._answer(408, _HEAD_TIMEOUT, f"the request head took longer than {bounds.head_timeout_s:g} s")
            else:  # an answer to an earlier (pipelined) request is still being sent: no room for ours
                on_event(_HEAD_TIMEOUT, None)
                self.transport.close()
                self._linger()

        def _body_expired(self) -> None:
            self._deadline = None
            self._armed = 0
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                cycle.scope[SCOPE_CLOSED] = _BODY_TIMEOUT  # type: ignore[literal-required]  # our key in the scope
                cycle.disconnected = True  # the app's body read ends; nothing it sends goes out any more
                cycle.message_event.set()
                self._answer(408, _BODY_TIMEOUT, f"the request body took longer than {bounds.body_timeout_s:g} s",
                             app_logs=True)
            else:
                on_event(_BODY_TIMEOUT, None)
                self.transport.close()
                self._linger()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                on_event("idle-timeout", None)
            super().timeout_keep_alive_handler()
            self._linger()

        # ------------------------------------------------------------- write deadline
        def pause_writing(self) -> None:
            super().pause_writing()
            self._write_wait()

        def resume_writing(self) -> None:
            super().resume_writing()
            self._write_stop()
            self._linger()  # closed meanwhile: what is left must still go out in time

        def _linger(self) -> None:
            """A closed transport keeps the connection (its file descriptor, and its place in the table until it
            is lost) until its buffer has gone out: the write deadline bounds that wait too."""
            if self.transport.is_closing() and self.transport.get_write_buffer_size():
                self._write_wait()

        def _write_wait(self) -> None:
            if self._write_deadline is None:
                self._unsent = _unacked(self.transport)
                self._write_deadline = self.loop.call_later(bounds.write_timeout_s, self._write_expired)

        def _write_stop(self) -> None:
            if self._write_deadline is not None:
                self._write_deadline.cancel()
                self._write_deadline = None

        def _write_expired(self) -> None:
            self._write_deadline = None
            unsent = _unacked(self.transport)
            if unsent < self._unsent:  # the client took some bytes: it has another period from now
                self._unsent = unsent
                self._write_deadline = self.loop.call_later(bounds.write_timeout_s, self._write_expired)
                return
            # it took none for the whole period: nothing can be answered to a client that does not read. The
            # app sees the disconnect: a request in progress is cancelled, its lease given back
            on_event(_WRITE_TIMEOUT, None)
            _reset(self.transport)

    def _make_room(connections: set[Any]) -> bool:
        """Close the connection the module docstring picks to make room for a new one; False when none may be."""
        chosen, lowest = None, (2, math.inf)
        for c in connections:
            rank = c._room_rank() if isinstance(c, GuardedProtocol) else None
            if rank is not None and rank < lowest:
                chosen, lowest = c, rank
        if chosen is None:
            return False
        chosen._make_room()
        return True

    return GuardedProtocol

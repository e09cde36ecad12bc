"""The connection guard (gateway/guard.py) against clients that are slow on purpose, and against its own pauses.

Real gateway processes on loopback, raw sockets for the slow clients and urllib for the honest ones:

* slow heads at the connection cap, reopened as soon as the gateway closes them, must not lock honest
  requests out: a full table evicts the connection whose head has been arriving longest;
* a client answered at once (401 without a key) that then trickles the body it declared is owed nothing:
  it makes room too, while an authenticated request whose body is still arriving keeps its connection;
* a head made only of the blank lines HTTP allows before a request line still has a deadline;
* a pipelining client that does not read its answers is not cut off by the head deadline while the gateway
  itself has stopped reading its requests, and a head that trickles while the gateway reads still times out;
* a client that takes none of its answers' bytes for ``write_timeout_s`` is cut, with or without a key (its
  connection held at the cap, its tenant's lease held), while one that reads slowly but steadily is not.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client as hc
import json
import selectors
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import CountingMock, GatewayProcess, http, key, tenant_cfg, wait_for
from proc_helpers import trickle
from test_gateway_reliability import _metric, addr, assert_json_error, connect

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

CAP = 32
HEAD_TIMEOUT_S = 2.0
UNREAD_CAP = 8
WRITE_TIMEOUT_S = 2.0
UNREAD_SNDBUF = 16_384  # the gateway's kernel send buffer per connection (Linux counts twice this)


@pytest.fixture(scope="module")
def capped(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """32 connections at most; deadlines long enough that no slow client here times out during a test."""
    cfg = {"connections": {"max_connections": CAP, "head_timeout_s": 300, "body_timeout_s": 300},
           "tenants": [tenant_cfg("a", limit=8)]}
    g = GatewayProcess(tmp_path_factory.mktemp("capped"), mock.url, cfg)
    yield g
    g.stop()


@pytest.fixture(scope="module")
def tight(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = {"connections": {"head_timeout_s": HEAD_TIMEOUT_S, "body_timeout_s": HEAD_TIMEOUT_S},
           "tenants": [tenant_cfg("a", limit=8)]}
    g = GatewayProcess(tmp_path_factory.mktemp("tight"), mock.url, cfg)
    yield g
    g.stop()


@pytest.fixture(scope="module")
def unread(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A short write deadline, a small cap and a fixed kernel send buffer; head and body deadlines long enough
    to play no part."""
    cfg = {"connections": {"max_connections": UNREAD_CAP, "write_timeout_s": WRITE_TIMEOUT_S, "head_timeout_s": 300,
                           "body_timeout_s": 300, "send_buffer_bytes": UNREAD_SNDBUF},
           "tenants": [tenant_cfg("a", limit=8)]}
    g = GatewayProcess(tmp_path_factory.mktemp("unread"), mock.url, cfg)
    yield g
    g.stop()


def complete(g: GatewayProcess) -> tuple[int, bytes]:
    """A valid completion through urllib (a new connection each time)."""
    status, _, body = http("POST", g.url + "/v1/completions", {"model": "mock", "prompt": "x", "max_tokens": 2},
                           {"Authorization": f"Bearer {key('a')}"}, timeout=60)
    return status, body


def events(g: GatewayProcess, event: str) -> float:
    try:
        return float(_metric(g.metrics(), f'admit_gateway_connection_events_total{{event="{event}"}}'))
    except AssertionError:  # no sample yet
        return 0.0


class SlowHeads:
    """``n`` connections that each send a request head one byte every ``every`` seconds (a slowloris); one the
    gateway answers or closes is read, kept in ``answers`` and replaced by a new one on the next tick, as an
    attacker reconnects. One thread for all of them."""

    HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "

    def __init__(self, g: GatewayProcess, n: int, every: float = 0.2) -> None:
        self.g, self.n, self.every = g, n, every
        self.answers: list[bytes] = []
        self.sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-heads", daemon=True)

    def __enter__(self) -> SlowHeads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for k in list(self.sel.get_map().values()):
            k.fileobj.close()  # type: ignore[union-attr]

    def _open(self) -> None:
        try:
            s = socket.create_connection(addr(self.g), timeout=10)
        except OSError:
            return  # refused under load: tried again on the next tick
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        st = [0, b""]  # bytes of HEAD sent, bytes read
        self.sel.register(s, selectors.EVENT_READ, st)
        self._send(s, st)  # the head begins at once: a connection that has sent nothing is merely idle

    def _send(self, s: Any, st: list[Any]) -> None:
        try:
            s.send(self.HEAD[st[0]:st[0] + 1] or b"a")
            st[0] += 1
        except (BlockingIOError, OSError):
            pass  # closed by the gateway: its answer is read on the next select

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in range(self.n - len(self.sel.get_map())):
                self._open()
            tick = time.monotonic() + self.every
            while (left := tick - time.monotonic()) > 0 and not self._stop.is_set():
                for k, _ in self.sel.select(left):
                    self._read(k)
            for k in list(self.sel.get_map().values()):
                self._send(k.fileobj, k.data)

    def _read(self, k: selectors.SelectorKey) -> None:
        s = k.fileobj
        try:
            data = s.recv(65536)  # type: ignore[union-attr]
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            k.data[1] += data
            return
        self.answers.append(k.data[1])
        self.sel.unregister(s)
        s.close()  # type: ignore[union-attr]


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {n.strip().lower(): v.strip() for n, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, body


# ----------------------------------------------------------------- the connection cap
def test_slow_heads_at_the_cap_do_not_lock_out_valid_requests(capped: GatewayProcess) -> None:
    """More slow-head connections than the cap, each reopened at once when closed: valid requests through
    urllib are still answered 200, because a full table evicts the connection whose head has been arriving
    longest (answered 408 ``evicted-slow``) instead of refusing the newcomer."""
    before = events(capped, "evicted-slow")
    with SlowHeads(capped, CAP + 8) as slow:
        # the table is full of slow heads once the gateway has closed as many as there are more than the cap
        wait_for(lambda: len(slow.answers) >= 8, 60, "the slow heads to fill the table")
        statuses = [complete(capped) for _ in range(10)]
        assert [s for s, _ in statuses] == [200] * 10, [(s, b[:200]) for s, b in statuses]
        answered = [parse(a) for a in slow.answers if a]
    assert answered, "no slow head was answered"
    for status, headers, body in answered:  # each evicted head got the guard's JSON error
        assert_json_error(status, headers, body, 408, "evicted-slow")
    assert events(capped, "evicted-slow") > before


def test_a_client_answered_while_its_body_trickles_makes_room(capped: GatewayProcess) -> None:
    """A keyless POST is answered 401 at once; the body it declared then trickles in, read only to be
    discarded. Such connections are owed nothing: with the table full of them, a new connection takes the
    place of the one answered longest ago (closed silently, ``evicted-idle``)."""
    before = events(capped, "evicted-idle")
    held: list[socket.socket] = []
    try:
        for _ in range(CAP):
            s = connect(capped)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000\r\n\r\n{\"model\":")
            s.settimeout(60)
            data = s.recv(65536)  # the 401 comes at once, before the body
            assert data.startswith(b"HTTP/1.1 401"), data[:200]
            held.append(s)
        status, body = complete(capped)
        assert status == 200, body[:300]
        assert events(capped, "evicted-idle") > before
    finally:
        for s in held:
            s.close()


def test_an_authenticated_request_whose_body_is_arriving_keeps_its_connection(capped: GatewayProcess) -> None:
    """The other side of the rule: a request with a valid key whose body is being read is a request in
    progress, never evicted (an honest slow upload must not be cut by anonymous newcomers). With every
    connection such a request, a new one is refused 503 at once."""
    held: list[socket.socket] = []
    try:
        for _ in range(CAP):
            s = connect(capped)
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key('a')}\r\n"
                      "Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 1000\r\n\r\n".encode())
            # "100 Continue" is written when the app starts reading the body: the request is in progress
            assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue")
            s.sendall(b'{"model":')
            held.append(s)
        with connect(capped) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            r = hc.HTTPResponse(s)
            r.begin()
            assert_json_error(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read(), 503,
                              "too-many-connections")
    finally:
        for s in held:
            s.close()
    wait_for(lambda: complete(capped)[0] == 200, 60, "a valid request once the bodies are gone")


# ----------------------------------------------------------------- head deadlines
def test_blank_lines_before_a_request_line_have_a_deadline(tight: GatewayProcess) -> None:
    """HTTP lets a request line follow empty lines, and the parser begins no message for them; a client that
    sends only those, a few at a time, must still hit the head deadline (from its first byte)."""
    with connect(tight) as s:
        data, elapsed = trickle(s, b"\r\n", 10 * HEAD_TIMEOUT_S)
    assert data, f"the gateway kept a connection sending only blank lines open for {elapsed:.1f} s"
    assert_json_error(*parse(data), 408, "head-timeout")
    assert elapsed >= HEAD_TIMEOUT_S * 0.95, elapsed


def test_a_head_trickling_while_the_gateway_reads_still_times_out(tight: GatewayProcess) -> None:
    """Bytes that keep coming do not extend the deadline: it runs from the head's first byte."""
    with connect(tight) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        data, elapsed = trickle(s, b"a", 10 * HEAD_TIMEOUT_S)
    assert_json_error(*parse(data), 408, "head-timeout")
    assert HEAD_TIMEOUT_S * 0.95 <= elapsed < 5 * HEAD_TIMEOUT_S, elapsed


class _File:
    """What http.client.HTTPResponse needs of a socket: one buffered reader shared by every response (which
    none of them closes), so that pipelined answers read back to back lose no bytes."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def makefile(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def close(self) -> None:
        pass


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n\r\n"


def _pad_for(first: int, n: int) -> int:
    """A pad that keeps every request boundary off the offsets where the gateway's reads (256,000 bytes) and
    loopback segments (64 KiB) may end, so that each read the gateway stops at leaves a head unfinished."""
    marks = {k * m for m in (256_000, 65_483, 65_536) for k in range(1, 40)}
    pad = 1000
    while any(first + i * (pad + len(HEALTH) - 2) + d in marks for i in range(n + 1) for d in range(-2, 3)):
        pad += 1
    return pad


def test_a_pipelining_client_that_stops_reading_is_not_cut_by_the_head_deadline(
        tight: GatewayProcess, mock: CountingMock) -> None:
    """One write: two completions with 4 MB answers each, then 2,000 small requests (2 MB). The client reads
    nothing for three head deadlines: the answers fill the socket buffers, the gateway stops reading the
    requests queued behind them (with a head half-read at the end of its last read), and it is not the
    client's head that is late. Then the client reads every answer."""
    big = json.dumps({"model": "mock", "prompt": "x", "max_tokens": 1_000_000}).encode()
    first = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key('a')}\r\n"
             f"Content-Type: application/json\r\nContent-Length: {len(big)}\r\n\r\n").encode() + big
    n = 2000
    pad = _pad_for(2 * len(first), n)
    health = HEALTH % (b"p" * pad)
    before = events(tight, "head-timeout")
    served = mock.stats.requests
    s = socket.create_connection(addr(tight), timeout=60)
    try:
        sender = threading.Thread(target=s.sendall, args=(first * 2 + health * n,), daemon=True)
        sender.start()
        wait_for(lambda: mock.stats.requests >= served + 2, 60, "both completions at the backend")
        time.sleep(3 * HEAD_TIMEOUT_S)  # waiting out the deadline: the client reads nothing meanwhile
        f = s.makefile("rb")
        got: list[int] = []
        try:
            for _ in range(n + 2):
                r = hc.HTTPResponse(_File(f))  # type: ignore[arg-type]
                r.begin()
                r.read()
                got.append(r.status)
        except (hc.HTTPException, OSError) as e:
            raise AssertionError(f"the connection ended after {len(got)} of {n + 2} answers ({e!r}); "
                                 f"head-timeout events: {events(tight, 'head-timeout') - before:g}") from None
        sender.join(60)
        assert got == [200] * (n + 2), got[:5]
    finally:
        s.close()
    assert events(tight, "head-timeout") == before


# ----------------------------------------------------------------- write deadlines
def narrow(g: GatewayProcess) -> socket.socket:
    """A connection with 536-byte segments and a 4 KiB receive buffer, set before connecting, as on a real
    network path rather than loopback's 64 KiB segments: the kernel sizes the gateway's send buffer from the
    segment size (a few hundred KB instead of megabytes, so a few thousand small answers fill it) and this
    client's kernel reopens its window after each few KB read instead of after each 64 KiB."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(60)
    s.connect(addr(g))
    return s


KEYLESS = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


def _send_quietly(s: socket.socket, data: bytes) -> None:
    """``sendall`` in a thread of its own: it blocks once the gateway stops reading, and ends when it cuts."""
    with contextlib.suppress(OSError):
        s.sendall(data)


def _until_closed(s: socket.socket) -> int:
    """Read what the gateway sent until it closed or reset the connection; the bytes read."""
    n = 0
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return n
        if not chunk:
            return n
        n += len(chunk)


def stream_request(step: str, max_tokens: int) -> bytes:
    body = json.dumps({"model": "mock", "prompt": "x", "max_tokens": max_tokens, "stream": True}).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key('a')}\r\n"
            f"x-admit-step-id: {step}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def test_keyless_clients_that_never_read_are_cut_by_the_write_deadline(unread: GatewayProcess) -> None:
    """As many keyless connections as the cap, each pipelining 3,000 requests (each answered 401 at once) and
    reading none of the answers: they fill the socket buffers and the transport's, the gateway stops writing
    to them and then reading from them, and each has a request in progress (the 401 waiting to be written),
    so the cap closes none of them to make room and without a write deadline they would hold the whole
    table for good. Each is cut (``write-timeout``, no answer: the client reads none) once it has taken no
    byte for ``write_timeout_s``, and honest requests are then served."""
    before = events(unread, "write-timeout")
    held = [narrow(unread) for _ in range(UNREAD_CAP)]
    try:
        for s in held:
            threading.Thread(target=_send_quietly, args=(s, KEYLESS * 3000), daemon=True).start()
        # /metrics itself is refused 503 (counted 0 here) while they hold the table
        wait_for(lambda: events(unread, "write-timeout") >= before + UNREAD_CAP, 60,
                 f"{UNREAD_CAP} connections cut by the write deadline", every=0.05)
        for s in held:  # each was closed by the gateway: what it had sent, then the end
            s.settimeout(30)
            assert _until_closed(s) > 0
        statuses = [complete(unread) for _ in range(UNREAD_CAP + 2)]
        assert [st for st, _ in statuses] == [200] * (UNREAD_CAP + 2), [(st, b[:200]) for st, b in statuses]
    finally:
        for s in held:
            s.close()


def test_a_stream_whose_client_stops_reading_gives_its_lease_back(unread: GatewayProcess) -> None:
    """A tenant's stream of 100,000 tokens (about 11 MB) whose client reads its first bytes and then nothing:
    once the buffers are full the gateway stops writing, and ``write_timeout_s`` later the connection is cut,
    so the request is cancelled like any whose client left: its lease comes back (in flight 0), the upstream
    is closed, and it is logged once."""
    before = events(unread, "write-timeout")
    step = f"unread-{time.monotonic_ns()}"
    with connect(unread) as s:
        s.sendall(stream_request(step, 100_000))
        s.settimeout(60)
        assert s.recv(4096).startswith(b"HTTP/1.1 200"), "the stream did not start"
        wait_for(lambda: events(unread, "write-timeout") > before, 60, "the stream cut by the write deadline")
        st = wait_for(lambda: (x := unread.state())["tenants"]["a"]["in_flight"] == 0
                      and x["requests_in_progress"] == 0 and x, 30, "the lease given back")
        assert st["in_flight"] == 0, st
        lines = wait_for(lambda: [x for x in unread.request_log() if x["step_id"] == step], 30, "its log line")
    assert [(x["status"], x["outcome"], x["tenant"]) for x in lines] == [(499, "client-disconnect", "a")], lines
    assert events(unread, "write-timeout") == before + 1


def test_a_slow_reader_that_keeps_reading_is_not_cut(unread: GatewayProcess) -> None:
    """A client that reads 4 KiB of a long stream every 0.2 s (20 KB/s, far slower than the gateway writes)
    for five write deadlines. The kernel takes more of the transport's buffer only once a third of its send
    buffer has been read, about every 6 s at this pace, so the gateway's writing stays paused longer than
    ``write_timeout_s`` at a time; but the client takes bytes all along, and only a client that has taken none
    for the whole period is cut."""
    before = events(unread, "write-timeout")
    with narrow(unread) as s:
        s.sendall(stream_request(f"slow-{time.monotonic_ns()}", 100_000))
        got = 0
        end = time.monotonic() + 5 * WRITE_TIMEOUT_S
        while time.monotonic() < end:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                chunk = b""
            assert chunk, f"the gateway cut a client reading 20 KB/s after {got} bytes"
            got += len(chunk)
            time.sleep(0.2)  # the client's pace, not a wait for the gateway
    assert events(unread, "write-timeout") == before


ESTABLISHED, FIN_WAIT1 = 1, 4  # TCP states as /proc/net/tcp numbers them


def _gateway_side(g: GatewayProcess, client: socket.socket) -> tuple[int, int] | None:
    """The gateway's side of ``client``'s connection in /proc/net/tcp: its TCP state and its kernel send queue
    (bytes written and not yet acknowledged); None once the socket is gone (reset)."""
    local, remote = f"{addr(g)[1]:04X}", f"{client.getsockname()[1]:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(":" + local) and f[2].endswith(":" + remote):
            return int(f[3], 16), int(f[4].split(":")[0], 16)
    return None


def _unauthorized(g: GatewayProcess) -> float:
    try:
        return float(_metric(g.metrics(), 'admit_gateway_requests_total{outcome="unauthorized",tenant="-"}'))
    except AssertionError:
        return 0.0


def _one_answer_size(g: GatewayProcess) -> int:
    """The bytes of the 401 a keyless request gets (its head and body may come in separate reads)."""
    with connect(g) as s:
        s.sendall(KEYLESS)
        answer = b""
        while b"\r\n\r\n" not in answer or len(parse(answer)[2]) < int(parse(answer)[1]["content-length"]):
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
    return len(answer)


def _let_go(g: GatewayProcess, client: socket.socket) -> str:
    """"" while the gateway's side of the connection is established; else "gone" or its TCP state."""
    side = _gateway_side(g, client)
    if side is None:
        return "gone"
    return "" if side[0] == ESTABLISHED else f"state {side[0]}"


def test_a_closed_connection_whose_last_answers_are_not_read_is_cut(unread: GatewayProcess) -> None:
    """A closed transport keeps its connection (file descriptor, place in the table) until its buffer has
    gone out. A keyless client fills the kernel's queues with 401s it does not read, leaves 24-30 KB more in
    the transport's buffer (under its high-water mark, so writing never pauses), then sends a request with
    ``Connection: close``: the gateway answers it and closes, and the close waits on a client that reads
    nothing. The write deadline bounds that wait too: the connection is reset (``write-timeout``).

    The test knows the state exactly: a 401 is counted in /metrics before its bytes are written, every answer
    has the same length, and the bytes left in the transport are those answered less the gateway's kernel
    queue (/proc/net/tcp) and this client's. The gateway's send buffer is fixed (``send_buffer_bytes``), so
    its kernel queue stays within it and cannot grow to take the transport's bytes when the connection
    closes (with the kernel's autotuning it sometimes did, and the close then went through at once)."""
    size = _one_answer_size(unread)
    before = events(unread, "write-timeout")
    base = _unauthorized(unread)

    def answered(n: int) -> None:
        wait_for(lambda: _unauthorized(unread) - base >= n, 60, f"{n} requests answered", every=0.02)

    with narrow(unread) as s:
        sent, held = 0, 0
        while held < 24_000:
            assert sent < 20_000, f"the buffers took {sent} answers of {size} bytes"
            s.sendall(KEYLESS * 20)  # about 5 KB of answers
            sent += 20
            answered(sent)
            side = _gateway_side(unread, s)
            assert side is not None and side[0] == ESTABLISHED, side
            assert side[1] <= 2 * UNREAD_SNDBUF, f"the kernel queued {side[1]} bytes past its fixed buffer"
            inq = struct.unpack("i", fcntl.ioctl(s, termios.FIONREAD, b"\0\0\0\0"))[0]
            held = sent * size - side[1] - inq
        s.sendall(KEYLESS.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
        answered(sent + 1)
        # the gateway closes with that answer's write; its side stays established while the close waits
        assert wait_for(lambda: _let_go(unread, s), 60, "the closed connection let go") == "gone"
        wait_for(lambda: events(unread, "write-timeout") > before, 30, "the write-timeout counted")
        s.settimeout(30)
        _until_closed(s)

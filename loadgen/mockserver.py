"""A small, fast OpenAI-compatible streaming server with known delays, for tests and benchmarks.

It answers ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed or not),
``GET /v1/models``, ``GET /health`` and ``GET /stats`` (request count and first/last arrival on
``CLOCK_MONOTONIC``; ``/stats?reset`` zeroes them after answering). A streamed answer sends its first
token ``ttft_ms`` after the request arrived and every further token ``itl_ms`` after the previous one,
then a ``usage`` event when ``stream_options.include_usage`` is set, then ``data: [DONE]``. The number
of tokens is ``max_tokens``.

Faults for tests are asked for per request with a body field ``"mock_fault"``:
``"429"``/``"503"``/``"500"`` (answer that status; 429 and 503 carry ``Retry-After: <retry_after>``),
``"malformed"`` (one event that is not JSON), ``"truncate"`` (end the stream without ``[DONE]``),
``"close"`` (drop the connection after the first token), ``"hang"`` (never answer) and
``"error_event"`` (an error event in the stream).

Run: ``python -m admit.loadgen.mockserver --port 0 --itl-ms 2``; it prints ``listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

MODEL = "mock"


def _response(status: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n"
        + extra
        + b"\r\n"
        + body
    )


def _chunk(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n" % len(data) + data + b"\r\n"


class Stats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.streams_done = 0
        self.first_ns = 0  # CLOCK_MONOTONIC arrival of the first and last completion request
        self.last_ns = 0

    def arrived(self) -> None:
        now = time.monotonic_ns()
        if self.requests == 0:
            self.first_ns = now
        self.last_ns = now
        self.requests += 1


class ServerProtocol(asyncio.Protocol):
    """One client connection: parses pipelined HTTP/1.1 requests and streams answers."""

    def __init__(self, ttft_s: float, itl_s: float, retry_after: float, stats: Stats) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.retry_after = retry_after
        self.stats = stats
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.loop = asyncio.get_event_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's transport is a Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].split(b"\r\n")
            length = 0
            for line in head[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            try:
                method, path, _ = head[0].split(b" ", 2)
            except ValueError:
                self._write(_response(b"400 Bad Request", b"{}", b"Connection: close\r\n"))
                self.transport.close()
                return
            self._handle(method, path, body)

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _handle(self, method: bytes, path: bytes, body: bytes) -> None:
        if method == b"GET":
            payload: dict[str, Any]
            if path.startswith(b"/v1/models"):
                payload = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "admit"}]}
            elif path.startswith(b"/health"):  # vLLM's liveness route (guidellm checks it before a run)
                self._write(_response(b"200 OK", b""))
                return
            elif path.startswith(b"/stats"):  # "/stats?reset" answers, then zeroes the counters
                st = self.stats
                payload = {
                    "requests": st.requests,
                    "streams_done": st.streams_done,
                    "first_ns": st.first_ns,
                    "last_ns": st.last_ns,
                }
                if b"reset" in path:
                    st.reset()
            else:
                self._write(_response(b"404 Not Found", b'{"error":"not found"}'))
                return
            self._write(_response(b"200 OK", json.dumps(payload).encode()))
            return
        self.stats.arrived()
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            self._write(_response(b"400 Bad Request", b'{"error":"body is not JSON"}'))
            return
        fault = str(req.get("mock_fault", ""))
        if fault in ("429", "503", "500"):
            status = {
                "429": b"429 Too Many Requests",
                "503": b"503 Service Unavailable",
                "500": b"500 Internal Error",
            }
            extra = b"Retry-After: %g\r\n" % self.retry_after if fault != "500" else b""
            self._write(_response(status[fault], b'{"error":"injected"}', extra))
            return
        if fault == "hang":
            self.busy = True
            return
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        chat = b"chat" in path
        prompt = req.get("prompt") if not chat else " ".join(m.get("content", "") for m in req.get("messages", []))
        usage = {"prompt_tokens": len(str(prompt).split()), "completion_tokens": n, "total_tokens": 0}
        usage["total_tokens"] = usage["prompt_tokens"] + n
        if not req.get("stream"):
            text = " tok" * n
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            )
            out = {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": MODEL,
                "choices": [choice],
                "usage": usage,
            }
            self._write(_response(b"200 OK", json.dumps(out).encode()))
            return
        self.busy = True
        self._write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        if chat:
            token = (
                b'{"id":"c","object":"chat.completion.chunk","model":"mock",'
                b'"choices":[{"index":0,"delta":{"content":" tok"}}]}'
            )
        else:
            token = b'{"id":"c","object":"text_completion","model":"mock","choices":[{"index":0,"text":" tok"}]}'
        tail = b""
        if (req.get("stream_options") or {}).get("include_usage"):
            tail += _chunk(json.dumps({"id": "c", "model": MODEL, "choices": [], "usage": usage}).encode())
        tail += _chunk(b"[DONE]") + b"0\r\n\r\n"
        state = {"left": n}
        tok = _chunk(token)

        def step() -> None:
            if self.transport is None:
                return
            if self.itl_s == 0 and not fault:  # no delay between tokens: one write for the whole stream
                self._write(tok * state["left"] + tail)
                state["left"] = 0
                self.stats.streams_done += 1
                self.busy = False
                if self.buf:
                    self._next()
                return
            if fault == "malformed" and state["left"] == n // 2:
                self._write(_chunk(b"this is not json"))
            if fault == "error_event" and state["left"] == n // 2:
                self._write(_chunk(b'{"error":{"message":"injected","code":500}}'))
            self._write(tok)
            state["left"] -= 1
            if fault == "close":
                self.transport.abort()
                return
            if state["left"] > 0:
                if self.itl_s > 0:
                    self.loop.call_later(self.itl_s, step)
                else:
                    step()
                return
            self._write(b"0\r\n\r\n" if fault == "truncate" else tail)
            self.stats.streams_done += 1
            self.busy = False
            if self.buf:
                self._next()

        if self.ttft_s > 0:
            self.loop.call_later(self.ttft_s, step)
        else:
            step()


async def serve(host: str, port: int, ttft_ms: float, itl_ms: float, retry_after: float, announce: bool = True) -> None:
    loop = asyncio.get_running_loop()
    stats = Stats()
    server = await loop.create_server(
        lambda: ServerProtocol(ttft_ms / 1000.0, itl_ms / 1000.0, retry_after, stats),
        host,
        port,
        backlog=4096,
    )
    bound = server.sockets[0].getsockname()
    if announce:
        print(f"listening on {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible streaming mock server with fixed delays")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18000, help="0 picks a free port")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    ap.add_argument("--itl-ms", type=float, default=0.0, help="delay between tokens")
    ap.add_argument("--retry-after", type=float, default=0.0, help="Retry-After seconds on injected 429/503")
    args = ap.parse_args(argv)
    try:
        import uvloop

        runner: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    try:
        runner(serve(args.host, args.port, args.ttft_ms, args.itl_ms, args.retry_after))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

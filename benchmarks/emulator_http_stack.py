"""Why the emulator has its own HTTP layer: server CPU per streamed token, raw protocol vs Starlette on uvicorn.

Both servers stream the same thing: every open stream gets one SSE event from a shared ticker every
``--tick-ms`` (the emulator's shape: one engine loop, every running request gets a token per step), for
``--tokens`` events, then ``[DONE]``. ``raw`` is ``admit.emulator.http`` (events written straight to the
transport); ``asgi`` is Starlette's ``StreamingResponse`` on uvicorn with httptools and uvloop (one queue
and one async generator per stream, the usual way). The same client (this process, one uvloop loop) opens
``--streams`` streams at once; the figure is the server process's CPU seconds per 1,000 events, measured
from /proc for each stack in turn in one run. Starlette/uvicorn are not project dependencies: install
them (e.g. ``pip install --target DIR starlette uvicorn httptools`` and ``PYTHONPATH=DIR``) or the ASGI row
is skipped.

    python benchmarks/emulator_http_stack.py --streams 500 --tokens 100 --tick-ms 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import uvloop

SERVER = r"""
import asyncio, sys, uvloop
kind, tick, tokens = sys.argv[1], float(sys.argv[2]) / 1000, int(sys.argv[3])
EVENT = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" tok"}]}\n\n'
sinks = set()

async def ticker():
    while True:
        await asyncio.sleep(tick)
        for s in list(sinks):
            s()

if kind == "raw":
    from admit.emulator.http import Connection, serve
    from admit.emulator.responses import http_chunk
    class App:
        def handle(self, req, conn):
            n = [0]
            def push():
                n[0] += 1
                if n[0] < tokens:
                    conn.write(http_chunk(EVENT))
                else:
                    sinks.discard(push)
                    conn.end_stream(http_chunk(EVENT + b"data: [DONE]\n\n") + b"0\r\n\r\n")
            conn.start_stream()
            conn.on_close = lambda: sinks.discard(push)
            sinks.add(push)
    async def main():
        asyncio.get_running_loop().create_task(ticker())
        srv = await serve(App(), "127.0.0.1", 0)
        print("listening on %s:%d" % srv.sockets[0].getsockname()[:2], flush=True)
        await asyncio.Event().wait()
    uvloop.run(main())
else:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route
    started = []
    async def completions(request):
        if not started:
            started.append(asyncio.get_running_loop().create_task(ticker()))
        await request.body()
        q = asyncio.Queue()
        n = [0]
        def push():
            n[0] += 1
            q.put_nowait(EVENT if n[0] < tokens else None)
        sinks.add(push)
        async def gen():
            try:
                while (ev := await q.get()) is not None:
                    yield ev
                yield EVENT + b"data: [DONE]\n\n"
            finally:
                sinks.discard(push)
        return StreamingResponse(gen(), media_type="text/event-stream")
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    import socket
    sock = socket.socket(); sock.bind(("127.0.0.1", 0))
    print("listening on %s:%d" % sock.getsockname(), flush=True)
    cfg = uvicorn.Config(app, loop="uvloop", http="httptools", log_level="warning", access_log=False, backlog=4096)
    uvicorn.Server(cfg).run(sockets=[sock])
"""


class Client(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[int]) -> None:
        self.done = done
        self.events = 0
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = b'{"prompt": "x", "stream": true}'
        transport.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"  # type: ignore[attr-defined]
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip

    def data_received(self, data: bytes) -> None:
        self.events += data.count(b"data: ")
        self.tail = (self.tail + data)[-5:]
        if self.tail == b"0\r\n\r\n" and not self.done.done():
            self.done.set_result(self.events)


async def drive(host: str, port: int, streams: int) -> int:
    loop = asyncio.get_running_loop()
    futs = []
    for _ in range(streams):
        fut: asyncio.Future[int] = loop.create_future()
        await loop.create_connection(lambda f=fut: Client(f), host, port)
        futs.append(fut)
    return sum(await asyncio.gather(*futs))


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def run(kind: str, args: argparse.Namespace) -> tuple[float, float, int] | None:
    if kind == "asgi":
        try:
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError:
            return None
    proc = subprocess.Popen([sys.executable, "-c", SERVER, kind, str(args.tick_ms), str(args.tokens)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        host, port = line.split()[-1].rsplit(":", 1)
        time.sleep(0.5)  # let the server finish starting (its CPU is not counted below either way)
        c0, t0 = cpu(proc.pid), time.monotonic()
        events = uvloop.run(drive(host, int(port), args.streams))
        return cpu(proc.pid) - c0, time.monotonic() - t0, events
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--tick-ms", type=float, default=30.0)
    args = ap.parse_args()
    print(f"{args.streams} streams x {args.tokens} events, one event per stream every {args.tick_ms:g} ms")
    base = None
    for kind in ("raw", "asgi"):
        r = run(kind, args)
        if r is None:
            print(f"{kind:>5}: skipped (starlette/uvicorn not importable)")
            continue
        c, wall, events = r
        per_k = c / events * 1000
        base = base or per_k
        print(f"{kind:>5}: {events} events in {wall:.2f} s, server CPU {c:.2f} s = {per_k * 1000:.1f} ms per 1k events "
              f"({per_k / base:.2f}x raw), server busy {c / wall:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()

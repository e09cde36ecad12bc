"""Serve the gateway on uvicorn with uvloop and httptools, on a socket bound before start-up.

Binding the socket here lets ``--port 0`` pick a free port and print it (``listening on HOST:PORT``),
which is how tests and scripts find the gateway. Access logging and uvicorn's ``server``/``date`` headers
are off: the request log is ours and the headers cost time on every answer.

`run_workers` (``admit gateway --workers N``) forks N worker processes, each with its own event loop,
uvicorn and `Gateway`, each listening on its own socket bound to the same port with ``SO_REUSEPORT`` (the
kernel spreads connections over them). The parent binds the port first without listening — that picks the
port for ``--port 0`` and holds it, and a socket that does not listen is given no connections — prints
``listening on`` once every worker accepts, forwards SIGTERM/SIGINT to the workers and waits for them. The
workers share nothing in memory: the CLI allows N > 1 only with the Redis backend, where limits, leases
and rate envelopes live in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import select
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from types import FrameType

import uvicorn
from admit.gateway.app import Gateway
from admit.gateway.guard import Bounds, default_max_connections, guarded_protocol, raise_open_file_limit


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


def bounds_of(app: Gateway) -> Bounds:
    """The connection bounds of the gateway's ``connections:`` section (gateway/guard.py)."""
    c = app.cfg.connections
    return Bounds(
        max_connections=c.max_connections if c.max_connections is not None else default_max_connections(),
        max_head_bytes=c.max_head_bytes,
        head_timeout_s=c.head_timeout_s,
        body_timeout_s=c.body_timeout_s,
        idle_timeout_s=c.idle_timeout_s,
        write_timeout_s=c.write_timeout_s,
        send_buffer_bytes=c.send_buffer_bytes,
    )


async def serve(app: Gateway, sock: socket.socket, announce: bool = True,
                ready: Callable[[], None] | None = None) -> None:
    bounds = bounds_of(app)
    app.connection_bounds = bounds
    config = uvicorn.Config(
        app,
        loop="none",
        # httptools' parser under a guard that bounds every connection (head size, deadlines, idle, count)
        http=guarded_protocol(bounds, app.on_connection_event),
        ws="none",
        lifespan="on",
        access_log=False,
        log_config=None,  # uvicorn's lines go to the process's one handler and its rate limit (gateway/logs.py)
        log_level="warning",
        server_header=False,
        date_header=False,
        backlog=4096,
        timeout_keep_alive=max(1, math.ceil(bounds.idle_timeout_s)),  # the guard sets the exact value
        proxy_headers=False,  # the gateway never reads the client address; the middleware costs every request
    )
    server = uvicorn.Server(config)
    app.open_connections = lambda: len(server.server_state.connections)

    async def tell() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.005)
        host, port = sock.getsockname()[:2]
        if announce:
            print(f"listening on {host}:{port}", flush=True)
        if ready is not None:
            ready()

    teller = asyncio.ensure_future(tell())
    try:
        await server.serve(sockets=[sock])
    finally:
        teller.cancel()


def run(app: Gateway, host: str, port: int) -> None:
    import uvloop

    raise_open_file_limit()
    sock = bind(host, port)
    quiet_gc()
    uvloop.run(serve(app, sock))


def quiet_gc() -> None:
    """Keep the cyclic garbage collector off the request path.

    Everything imported at start-up (tens of thousands of objects: numpy, pydantic, the policy registry)
    goes into the permanent generation, where no collection scans it again, and the youngest generation is
    collected every 20,000 net allocations of container objects instead of 700. A request allocates a few
    hundred short-lived objects that reference counting frees; without this the collector took a large
    share of the gateway's CPU under load (docs/BENCHMARKS.md, "Gateway").
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _reuseport(host: str, port: int, listen: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(4096)
    return sock


def _tell(fd: int) -> None:
    """A worker's one byte to the parent: it accepts connections."""
    os.write(fd, b"1")


def run_workers(make_app: Callable[[], Gateway], host: str, port: int, workers: int,
                start_timeout_s: float = 120.0) -> int:
    """``workers`` processes serving one port through SO_REUSEPORT; returns the exit status (see module doc)."""
    import uvloop

    raise_open_file_limit()
    hold = _reuseport(host, port, listen=False)
    port = hold.getsockname()[1]
    ready_r, ready_w = os.pipe()
    pids: list[int] = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:  # a worker: its own socket, loop, server and gateway
            code = 0
            try:
                hold.close()
                os.close(ready_r)
                sock = _reuseport(host, port, listen=True)
                quiet_gc()
                uvloop.run(serve(make_app(), sock, announce=False, ready=lambda: _tell(ready_w)))
            except BaseException:  # reported, then the worker ends with status 1
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    os.close(ready_w)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    started = 0
    while started < workers and not stopping:
        got, _, _ = select.select([ready_r], [], [], start_timeout_s)
        data = os.read(ready_r, workers) if got else b""
        if not data:  # timed out, or every worker closed the pipe: one failed to start
            print(f"error: {workers - started} of {workers} workers did not start", file=sys.stderr, flush=True)
            stop(signal.SIGTERM, None)
            break
        started += len(data)
    if started == workers:
        print(f"listening on {host}:{port}", flush=True)
    status = 0
    alive = set(pids)
    while alive:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries waitpid itself
            continue
        alive.discard(pid)
        code = os.waitstatus_to_exitcode(st)
        if code != 0 and not stopping:  # a worker died on its own: take the others down too
            print(f"error: worker {pid} exited with status {code}", file=sys.stderr, flush=True)
            stop(signal.SIGTERM, None)
        if code not in (0, -signal.SIGTERM):
            status = 1
    hold.close()
    return status if started == workers else 1

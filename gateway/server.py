"""Serve the gateway on uvicorn with uvloop and httptools, on a socket bound before start-up.

Binding the socket here lets ``--port 0`` pick a free port and print it (``listening on HOST:PORT``),
which is how tests and scripts find the gateway. Access logging and uvicorn's ``server``/``date`` headers
are off: the request log is ours and the headers cost time on every answer.
"""

from __future__ import annotations

import asyncio
import gc
import socket

import uvicorn
from admit.gateway.app import Gateway


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


async def serve(app: Gateway, sock: socket.socket, announce: bool = True) -> None:
    config = uvicorn.Config(
        app,
        loop="none",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
        backlog=4096,
        timeout_keep_alive=30,
        proxy_headers=False,  # the gateway never reads the client address; the middleware costs every request
    )
    server = uvicorn.Server(config)

    async def tell() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.005)
        host, port = sock.getsockname()[:2]
        if announce:
            print(f"listening on {host}:{port}", flush=True)

    teller = asyncio.ensure_future(tell())
    try:
        await server.serve(sockets=[sock])
    finally:
        teller.cancel()


def run(app: Gateway, host: str, port: int) -> None:
    import uvloop

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

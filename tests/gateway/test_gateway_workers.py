"""``admit gateway --workers N``: N processes on one port (SO_REUSEPORT) enforcing one limit through Redis.

A real redis-server, the counting mock backend and the gateway as a process tree: the limit holds at the
backend across the workers, both workers serve (their leases are seen in Redis under their own pids), and
SIGTERM to the parent stops every worker. Without a ``redis:`` section the CLI refuses N > 1.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
import pytest
import redis
import yaml
from admit.live.stack import alive
from gateway_helpers import ADMIN_TOKEN, CountingMock, key, tenant_cfg, wait_for
from proc_helpers import read_listening
from redis_helpers import RedisServer

pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


def _spawn(tmp: Path, backend: str, cfg: dict, workers: int) -> subprocess.Popen[str]:
    path = tmp / "tenants.yaml"
    path.write_text(yaml.safe_dump({"admin": {"token_env": "ADMIT_TEST_ADMIN_TOKEN"}, **cfg}))
    return subprocess.Popen(
        [sys.executable, "-m", "admit.gateway", "--backend", backend, "--config", str(path), "--port", "0",
         "--workers", str(workers)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "ADMIT_TEST_ADMIN_TOKEN": ADMIN_TOKEN},
    )


def _children(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_workers_need_the_redis_backend(tmp_path: Path) -> None:
    proc = _spawn(tmp_path, "http://127.0.0.1:9", {"tenants": [tenant_cfg("a", limit=2)]}, 2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "--workers 2 needs a 'redis:' section" in err


def test_two_workers_share_one_limit_and_stop_together(tmp_path: Path, rs: RedisServer) -> None:
    mock = CountingMock(itl_ms=25)
    cfg = {"redis": {"url": rs.url, "poll_s": 0.02, "timeout_s": 1},
           "tenants": [tenant_cfg("a", limit=3, max_queue=50, queue_timeout_s=60)]}
    proc = _spawn(tmp_path, mock.url, cfg, 2)
    try:
        try:
            url = read_listening(proc, 120, "gateway workers")  # printed once both workers accept
        except RuntimeError:
            proc.wait(10)
            raise AssertionError(f"the workers did not start:\n{proc.stderr.read()[-3000:]}") from None
        workers = _children(proc.pid)
        assert len(workers) == 2
        holders: set[str] = set()
        done = threading.Event()

        def watch_leases() -> None:  # which processes hold leases while the burst runs
            with redis.Redis.from_url(rs.url) as r:
                while not done.is_set():
                    holders.update(m.decode().split("-", 1)[0] for m in r.zrange("admit:leases:a", 0, -1))

        async def one() -> int:
            # a connection per request, so the kernel spreads them over the workers
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                body = {"model": "mock", "prompt": "x", "max_tokens": 12, "stream": True}
                async with s.post(url + "/v1/completions", json=body,
                                  headers={"Authorization": f"Bearer {key('a')}"}) as r:
                    await r.read()
                    return r.status

        async def burst() -> list[int]:
            return await asyncio.gather(*(one() for _ in range(16)))

        wait_for(lambda: mock.counter.now == 0, what="an idle backend")
        mock.counter.reset_max()
        watcher = threading.Thread(target=watch_leases)
        watcher.start()
        try:
            assert asyncio.run(burst()) == [200] * 16
        finally:
            done.set()
            watcher.join(10)
        assert mock.counter.max == 3  # reached, never passed, by the two workers together
        assert holders == {str(w) for w in workers}, (holders, workers)  # both workers admitted requests
        with redis.Redis.from_url(rs.url) as r:
            wait_for(lambda: r.zcard("admit:leases:a") == 0, 10, "every lease released")
        proc.terminate()  # SIGTERM to the parent: every worker stops
        assert proc.wait(30) == 0
        wait_for(lambda: not any(alive(w) for w in workers), 10, "the workers to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        mock.stop()

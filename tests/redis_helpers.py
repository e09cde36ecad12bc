"""A real redis-server (Debian's package) on a free loopback port in a temporary folder, for the tests.

The server keeps an append-only file, so a test can kill it and start it again on the same port and folder
and find its state, as a deployment with persistence would. Redis write()s the file before it sends the
replies of each event-loop turn, so a killed server's file holds every write it acknowledged (the kernel
keeps it); the tests kill the process, not the machine, so no fsync is needed (``appendfsync no``). With
``always`` every turn waited for an fsync, which a disk busy with other jobs can stretch past the
gateway's Redis timeout.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, folder: Path) -> None:
        if REDIS_SERVER is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server; `make test` does it)")
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        for attempt in range(5):
            # free_port() closes its socket before redis-server binds the port: another process may take it
            # in between, and then this picks another one (only here: a restart must keep its port)
            self.port = free_port()
            self.url = f"redis://127.0.0.1:{self.port}/0"
            try:
                self.start()
                break
            except RuntimeError:
                log = self.folder / "redis.log"
                if attempt == 4 or not (log.is_file() and "Address already in use" in log.read_text()):
                    raise
                log.unlink()

    def start(self, timeout: float = 60.0) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--save", "", "--appendonly", "yes", "--appendfsync", "no", "--daemonize", "no",
             "--protected-mode", "no", "--logfile", str(self.folder / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """Like a crash: SIGKILL, no shutdown save (the append-only file has every acknowledged write)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

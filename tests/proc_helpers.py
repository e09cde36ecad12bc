"""Child processes the tests start: wait for the ``listening on HOST:PORT`` line that every server of the
project (emulator, gateway, mock server) prints once it accepts connections; and a client that trickles bytes
at one of them."""

from __future__ import annotations

import selectors
import socket
import subprocess
import time


def read_listening(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    """The server's URL from its stdout; if it exits or stays silent for ``timeout`` s, it is killed, reaped
    and its pipe closed, and ``RuntimeError`` names ``what``. The deadline only bounds a hang: generous."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.1):
                line = proc.stdout.readline()
                if line.startswith("listening on "):
                    return "http://" + line.split()[-1]
                if not line and proc.poll() is not None:
                    break
    proc.kill()
    proc.wait(5)
    proc.stdout.close()
    raise RuntimeError(f"{what} did not start")


def trickle(s: socket.socket, byte: bytes, limit_s: float, every: float = 0.25) -> tuple[bytes, float]:
    """Send ``byte`` every ``every`` s on ``s`` until the server closes the connection (``limit_s`` bounds a
    server that never does); what it answered and how long it took."""
    s.settimeout(every)
    t0 = time.monotonic()
    data = b""
    while time.monotonic() - t0 < limit_s:
        try:
            s.sendall(byte)
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - t0

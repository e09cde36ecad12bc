"""live/stack.py ``wait_idle``: the one wait for a vLLM-compatible server to drain, read from its metrics page
(calibration, the real-vLLM fidelity run, the protocol's cool-down and the demo all use it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from admit.live.stack import StackError, wait_idle


class Engine:
    """A loopback HTTP server whose /metrics page reports ``running`` requests, one fewer per scrape."""

    def __init__(self, running: int) -> None:
        self.running = running
        self.scrapes = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engine.scrapes += 1
                body = (f"vllm:num_requests_running{{engine=\"0\"}} {engine.running}\n"
                        f"vllm:num_requests_waiting{{engine=\"0\"}} 0\n").encode()
                engine.running = max(0, engine.running - 1)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine(running=2)
    yield e
    e.server.shutdown()


def test_it_returns_once_the_page_shows_nothing_running_or_waiting(engine: Engine) -> None:
    wait_idle(engine.url, timeout_s=30)
    assert engine.scrapes == 3 and engine.running == 0  # busy 2, busy 1, idle: it stopped at the first idle page


def test_a_server_that_stays_busy_is_named_in_the_error(engine: Engine) -> None:
    engine.running = 10**9
    with pytest.raises(StackError, match=r"timed out after 1 s waiting for the server at .* to be idle"):
        wait_idle(engine.url, timeout_s=1)

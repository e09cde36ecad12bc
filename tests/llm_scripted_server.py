"""A scripted OpenAI-compatible chat server on loopback, in a thread (helper for the LLM policy tests).

It speaks real HTTP to the real ``openai`` client. Each POST to ``/v1/chat/completions`` takes the next
scripted step (or the default step once the script is used up) and records the request body, so tests
can both choose what the "model" says and check what the policy sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Step:
    content: str = ""  # the assistant message text
    finish_reason: str = "stop"
    status: int = 200  # anything else is sent as an error body
    delay_s: float = 0.0  # wait before answering (to outlast the client's timeout)
    raw_body: bytes | None = None  # sent as-is with status 200, instead of a chat completion


def reply(deltas: list[Any], rationale: str = "scripted") -> Step:
    return Step(json.dumps({"rationale": rationale, "deltas": deltas}))


class ScriptedServer:
    def __init__(self, default: Step | None = None) -> None:
        self.default = default or Step(json.dumps({"rationale": "hold", "deltas": []}))
        self.script: deque[Step] = deque()
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def push(self, *steps: Step) -> None:
        with self._lock:
            self.script.extend(steps)

    def _next(self, body: dict[str, Any]) -> Step:
        with self._lock:
            self.requests.append(body)
            return self.script.popleft() if self.script else self.default

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                step = server._next(body)
                if step.delay_s and server._stop.wait(step.delay_s):
                    return
                if step.raw_body is not None:
                    self._send(200, step.raw_body)
                elif step.status != 200:
                    err = {"error": {"message": "scripted failure", "type": "server_error", "code": step.status}}
                    self._send(step.status, json.dumps(err).encode())
                else:
                    self._send(200, json.dumps(completion(body, step)).encode())

        return Handler

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def completion(request: dict[str, Any], step: Step) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "scripted"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": step.content},
                "finish_reason": step.finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }

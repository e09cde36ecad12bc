"""Small helpers for a framework-free ASGI app: read a bounded body, send JSON, answer errors.

Every error the gateway makes is JSON in OpenAI's shape, ``{"error": {"message", "type", "code"}}``, plus
a top-level ``reason`` (the same machine-readable string as the ``x-admit-reason`` header).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

REASON_HEADER = b"x-admit-reason"
_JSON = (b"content-type", b"application/json")


class HttpError(Exception):
    """Answer ``status`` with a JSON error; ``reason`` goes to the body, the header and the request log."""

    def __init__(self, status: int, reason: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s


def header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return v
    return None


def bearer(scope: Scope) -> bytes | None:
    value = header(scope, b"authorization")
    if value is None or len(value) < 8 or value[:7].lower() != b"bearer ":
        return None
    return value[7:].strip()


async def read_body(receive: Receive, scope: Scope, limit: int) -> bytes:
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, "body-too-large", f"the body is larger than {limit} bytes")
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionResetError("client went away while sending the body")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpError(413, "body-too-large", f"the body is larger than {limit} bytes")
        parts.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(parts)


def retry_after_value(seconds: float) -> bytes:
    """``Retry-After`` is whole seconds (RFC 9110): round up so a client never comes back too early."""
    return str(max(0, math.ceil(seconds - 1e-9))).encode()


async def send_json(send: Send, status: int, obj: Any, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    hdrs = [_JSON, (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          503: "service_unavailable", 504: "timeout"}


async def send_error(send: Send, err: HttpError) -> None:
    headers = [(REASON_HEADER, err.reason.encode())]
    body: dict[str, Any] = {
        "error": {"message": err.message, "type": _TYPES.get(err.status, "error"), "code": err.reason},
        "reason": err.reason,
    }
    if err.retry_after_s is not None:
        headers.append((b"retry-after", retry_after_value(err.retry_after_s)))
        headers.append((b"x-admit-retry-after-ms", str(math.ceil(err.retry_after_s * 1000)).encode()))
        body["retry_after_s"] = round(err.retry_after_s, 3)
    if err.status == 405:
        headers.append((b"allow", b"POST"))
    await send_json(send, err.status, body, headers)

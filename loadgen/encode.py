"""Pre-encoding of HTTP/1.1 requests: each request's full bytes are built before the stage starts.

The prompt of ``n`` tokens is ``n`` copies of a common short word (one token in the usual BPE
vocabularies), optionally preceded by a per-request number so that a server's prefix cache cannot
serve every prompt from one entry. Bodies ask for streaming with ``stream_options.include_usage`` so
token counts come from the server's ``usage`` and no tokenizer is needed; a tenant template with
``stream=False`` sends ``"stream": false`` instead (the answer's ``usage`` then comes in its JSON body).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

WORD = " hello"


@dataclass(frozen=True)
class Target:
    """Where requests go: host, port, TLS and the request path."""

    host: str
    port: int
    tls: bool
    path: str

    @classmethod
    def from_url(cls, url: str, api: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must look like http://HOST:PORT[/v1], got {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        base = parts.path.rstrip("/")
        if not base.endswith("/v1"):
            base = base + "/v1"
        endpoint = "/chat/completions" if api == "chat" else "/completions"
        return cls(parts.hostname, port, tls, base + endpoint)


@dataclass
class TenantTemplate:
    """Everything per tenant that goes into each request (picklable, sent to every worker)."""

    name: str
    model: str
    api: str
    headers: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    ignore_eos: bool = True
    unique_prompts: bool = True
    stream: bool = True


class Encoder:
    """Builds request bytes for a target; caches the repeated prompt text per length."""

    def __init__(self, target: Target, templates: list[TenantTemplate]) -> None:
        self.target = target
        self.templates = templates
        self._words: dict[int, str] = {}
        host = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
        self._heads = []
        for t in templates:
            lines = [
                f"POST {target.path} HTTP/1.1",
                f"Host: {host}",
                "Content-Type: application/json",
                "Accept: text/event-stream" if t.stream else "Accept: application/json",
                "Connection: keep-alive",
            ]
            lines += [f"{k}: {v}" for k, v in t.headers.items()]
            self._heads.append(("\r\n".join(lines) + "\r\nContent-Length: ").encode())

    def body(self, tenant: int, index: int, prompt_tokens: int, output_tokens: int) -> bytes:
        t = self.templates[tenant]
        text = self._words.get(prompt_tokens)
        if text is None:
            text = self._words[prompt_tokens] = WORD * prompt_tokens
        if t.unique_prompts:
            text = f"{index}{text}"
        payload: dict[str, Any] = {"model": t.model}
        if t.api == "chat":
            payload["messages"] = [{"role": "user", "content": text}]
            payload["max_completion_tokens"] = int(output_tokens)
        else:
            payload["prompt"] = text
        payload["max_tokens"] = int(output_tokens)
        if t.ignore_eos:
            payload["ignore_eos"] = True
            payload["min_tokens"] = int(output_tokens)
        if t.stream:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        else:
            payload["stream"] = False
        payload.update(t.extra)
        return json.dumps(payload, separators=(",", ":")).encode()

    def request(self, tenant: int, index: int, prompt_tokens: int, output_tokens: int) -> bytes:
        body = self.body(tenant, index, prompt_tokens, output_tokens)
        return self._heads[tenant] + str(len(body)).encode() + b"\r\n\r\n" + body


def tenant_headers(api_key: str | None, tenant_header: str | None, name: str, extra: dict[str, str]) -> dict[str, str]:
    """Identification headers: ``Authorization: Bearer KEY``, the tenant-name header, then any others."""
    headers: dict[str, str] = {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if tenant_header:
        headers[tenant_header] = name
    headers.update(extra)
    for key, value in headers.items():
        if any(c in key + value for c in "\r\n") or not key or ":" in key:
            raise ValueError(f"header {key!r} is not a valid HTTP header name/value")
    return headers

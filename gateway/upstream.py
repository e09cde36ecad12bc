"""The pooled async HTTP client towards the backend (aiohttp), with the gateway's error mapping.

One ``ClientSession`` with an unbounded keep-alive pool (admission, not the pool, bounds concurrency).
Bodies pass through untouched (no decompression; ``Accept-Encoding`` is not forwarded, so the backend
answers in identity encoding). A connection that fails before any response header arrives is retried once
on a fresh connection (a pooled keep-alive connection may have been closed by a restarted backend); if
that fails too the backend is unreachable: `NoBackend` (the gateway answers 503).
"""

from __future__ import annotations

import aiohttp

_RETRYABLE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class NoBackend(Exception):
    """No backend answered: connection refused, reset or closed before the response headers."""


class BackendTimeout(Exception):
    """The backend accepted the request but sent nothing for longer than the configured timeout."""


class Upstream:
    def __init__(self, base_url: str, timeout_s: float, api_key: str | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._auth = f"Bearer {api_key}" if api_key else None
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=30)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=self.timeout_s),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def request(self, method: str, path: str, body: bytes | None) -> aiohttp.ClientResponse:
        """Send one request; the caller reads the response and must ``release()`` or ``close()`` it."""
        assert self.session is not None, "Upstream.start() was not called"
        headers = {"Content-Type": "application/json", "Accept": "*/*"}
        if self._auth is not None:
            headers["Authorization"] = self._auth
        url = self.base + path
        for attempt in (0, 1):
            try:
                return await self.session.request(method, url, data=body, headers=headers)
            except aiohttp.ClientConnectorError as exc:
                raise NoBackend(f"cannot connect to the backend ({exc.os_error.strerror or exc})") from None
            except _RETRYABLE as exc:
                if attempt:
                    raise NoBackend(f"the backend closed the connection ({type(exc).__name__})") from None
            except TimeoutError:
                raise BackendTimeout(f"no answer from the backend within {self.timeout_s:g} s") from None
        raise NoBackend("unreachable")  # pragma: no cover

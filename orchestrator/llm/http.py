"""The HTTP transport of every call to a backend: JSON bodies over aiohttp, one session per event loop.

Why aiohttp here: a worker's CPU competes with the model it calls (on a CPU node, for the same
cores), and every sample is one request. Per request, httpx spent 3.5-4.5 ms of CPU where aiohttp
spends 0.6 ms (2,000 requests, 16 at a time, to one aiohttp server in the same process), and py-spy
put httpx at a third of a busy worker's Python time in benchmarks.verl. One-shot synchronous
calls outside the worker (a CLI asking a server once) may keep using httpx.

Idle connections are kept KEEPALIVE_S, under the 5 s after which uvicorn-served backends (vLLM,
SGLang) close them, so a reused connection is rarely one the server is closing; when it is, the
exchange fails as HttpFailure and the caller retries it like any transient failure. There is no
bound on connections: a worker's concurrency is its run pool's, and a bounded pool would queue the
requests above the bound behind the ones running.
"""

from __future__ import annotations

import functools
import os
import ssl
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import certifi
import orjson

if TYPE_CHECKING:
    import aiohttp

from orchestrator.errors import HpcRolloutError

KEEPALIVE_S = 2.0
DEFAULT_TIMEOUT_S = 300.0
JSON_HEADERS = {"content-type": "application/json"}


class HttpFailure(HpcRolloutError):
    """The exchange failed below HTTP: refused, reset, closed early, a body cut short. Callers
    turn it into an LLMError (BackendFailed) or a probe's answer; it does not leave the package."""


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    content: bytes

    def json(self) -> Any:
        """The body parsed as JSON; ValueError when it is not JSON."""
        return orjson.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


@functools.cache
def shared_tls() -> ssl.SSLContext:
    """One TLS context per process. Building one loads the CA bundle: ~80 ms of CPU each, which
    per task was most of a worker's CPU per chat job (measured with benchmarks.backends). The
    trust is what httpx's was: SSL_CERT_FILE or SSL_CERT_DIR when set (a site's own CAs), else
    certifi's bundle."""
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    return ssl.create_default_context(cafile=certifi.where())


class BackendHttp:
    """JSON requests to backends on keep-alive connections; open it on the event loop that uses it
    (an aiohttp session cannot outlive its loop): `async with BackendHttp() as http: ...`."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, keepalive_s: float = KEEPALIVE_S) -> None:
        self.timeout_s = timeout_s
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self.closed = False

    def _opened(self) -> aiohttp.ClientSession:
        if self.closed:
            raise RuntimeError("this BackendHttp is closed: open a new one")
        if self._session is None:
            import aiohttp   # at first use: its import builds TLS contexts (~0.1-0.3 s of every worker's start)

            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keepalive_s, ssl=shared_tls())
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def request(self, method: str, url: str, body: dict[str, Any] | None = None, *,
                      timeout_s: float | None = None, connect_timeout_s: float | None = None) -> HttpAnswer:
        """One exchange, its whole body read. TimeoutError when `timeout_s` (the whole exchange,
        not one read) passes; HttpFailure when the connection fails."""
        import aiohttp   # loaded by _opened() below already, or now

        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s, connect=connect_timeout_s)
        data = None if body is None else orjson.dumps(body)
        try:
            async with self._opened().request(method, url, data=data, timeout=timeout,
                                              headers=None if body is None else JSON_HEADERS) as response:
                return HttpAnswer(response.status, await response.read())
        except TimeoutError:
            raise
        except aiohttp.ClientError as exc:
            raise HttpFailure(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc

    async def get(self, url: str, timeout_s: float | None = None) -> HttpAnswer:
        return await self.request("GET", url, timeout_s=timeout_s)

    async def aclose(self) -> None:
        self.closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> "BackendHttp":
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self.aclose()

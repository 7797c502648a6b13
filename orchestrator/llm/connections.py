"""Keep-alive HTTP connections to the backends, shared by every task of one worker.

A task used to open its own client and close it at its end: a TCP connect and a server-side
accept per task, and the close on the worker's event loop. On short tasks that was the largest
single cost of a busy worker's loop (py-spy on benchmarks.verl: the session's close alone ~16%),
and it made the backend's own event loop take connections beside generating.

httpx's default pool would queue a worker's 101st concurrent request: this pool has no bound
(a worker's concurrency is its run pool's). Idle connections are dropped after
KEEPALIVE_EXPIRY_S, under the 5 s after which uvicorn-served backends (vLLM, SGLang) close them,
so a reused connection is rarely one the server is closing; when it is, the request is retried
like any transient failure (orchestrator/llm/client.py).
"""

from __future__ import annotations

import asyncio

import httpx

from orchestrator.llm.client import new_http_client

KEEPALIVE_EXPIRY_S = 2.0
MAX_IDLE_CONNECTIONS = 256


class SharedConnections:
    """One httpx client per event loop: a client cannot outlive the loop it was opened on, and a
    process that runs several loops one after the other (tests, CLI calls) gets a fresh one each."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            self._client = new_http_client(limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=MAX_IDLE_CONNECTIONS,
                keepalive_expiry=KEEPALIVE_EXPIRY_S))
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the connections opened on the running loop (a worker's stop)."""
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()

"""Keep-alive HTTP connections to the backends, shared by every task of one worker.

A task used to open its own client and close it at its end: a TCP connect and a server-side
accept per task, and the close on the worker's event loop. On short tasks that was the largest
single cost of a busy worker's loop (py-spy on benchmarks.verl: the session's close alone ~16%),
and it made the backend's own event loop take connections beside generating. How long idle
connections are kept and why there is no bound: orchestrator/llm/http.py.
"""

from __future__ import annotations

import asyncio

from orchestrator.llm.http import BackendHttp


class SharedConnections:
    """One transport per event loop: a session cannot outlive the loop it was opened on, and a
    process that runs several loops one after the other (tests, CLI calls) gets a fresh one each."""

    def __init__(self) -> None:
        self._http: BackendHttp | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> BackendHttp:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop or self._http.closed:
            self._http = BackendHttp()
            self._loop = loop
        return self._http

    async def aclose(self) -> None:
        """Close the connections opened on the running loop (a worker's stop)."""
        http, self._http = self._http, None
        if http is not None and self._loop is asyncio.get_running_loop():
            await http.aclose()

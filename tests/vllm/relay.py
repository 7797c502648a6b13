"""A recording relay in front of a real server, for tests that compare with what it answered.

    with RecordingRelay(vllm.url) as relay:     # relay.url: register this instead of vllm.url
        ...
    relay.completions()                         # every /v1/completions exchange, in order
    with relay.holding_answers():               # vLLM answers, the relay keeps the answers of
        ...                                     # /v1/completions until the block ends


Every request is forwarded unchanged (method, path, query, body) and every answer returned
unchanged; each exchange is kept as parsed JSON. The truth a test checks against is then
vLLM's own response body, not our client's reading of it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from orchestrator.llm.urls import server_root
from tests.llm.app_thread import AppThread

COMPLETIONS = "/v1/completions"


@dataclass(frozen=True)
class Exchange:
    method: str
    path: str
    request: Any        # the JSON body sent, or None
    status: int
    response: Any       # the JSON body answered, or the text when it is not JSON

    @property
    def choice(self) -> dict[str, Any]:
        return self.response["choices"][0]


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


@dataclass
class RecordingRelay:
    upstream: str
    exchanges: list[Exchange] = field(default_factory=list)
    url: str = ""
    _server: AppThread | None = field(default=None, repr=False)
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)
    _holding: bool = field(default=False, repr=False)
    held: int = 0       # completions answered by the server whose answers the relay holds now

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        body = await request.read()
        target = server_root(self.upstream) + request.path_qs
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self._session.request(request.method, target, data=body or None, headers=headers) as answer:
            payload = await answer.read()
            status, content_type = answer.status, answer.content_type
        self.exchanges.append(Exchange(request.method, request.path, _parse(body), status, _parse(payload)))
        if request.path == COMPLETIONS and self._holding:
            self.held += 1
            while self._holding:   # sampled already: the caller's request stays in flight
                await asyncio.sleep(0.01)
            self.held -= 1
        return web.Response(status=status, body=payload, content_type=content_type)

    async def _open(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))

    async def _close(self, _: web.Application) -> None:
        assert self._session is not None
        await self._session.close()

    @contextmanager
    def holding_answers(self) -> Iterator[None]:
        """Completions keep being sampled, their answers wait in the relay until the block ends."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False

    def completions(self) -> list[Exchange]:
        """The answered /v1/completions exchanges, oldest first."""
        return [e for e in self.exchanges if e.path == COMPLETIONS and e.status == 200]

    def by_prompt(self) -> dict[tuple[int, ...], Exchange]:
        """Answered completions keyed by the prompt ids sent (each prompt must be unique)."""
        table: dict[tuple[int, ...], Exchange] = {}
        for exchange in self.completions():
            key = tuple(exchange.request["prompt"])
            assert key not in table, f"prompt sent twice: {key[:8]}..."
            table[key] = exchange
        return table

    def __enter__(self) -> "RecordingRelay":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._server = AppThread(app)
        root = self._server.__enter__()
        self.url = root + "/v1" if self.upstream.rstrip("/").endswith("/v1") else root
        return self

    def __exit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.__exit__()

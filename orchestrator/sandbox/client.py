"""Async client of the in-sandbox execution server (JSON lines over a Unix socket)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson

from orchestrator.sandbox.errors import SandboxClosedError

STREAM_LIMIT = 128 << 20  # large downloads come back as one JSON line


class ExecClient:
    def __init__(self, socket_path: str, secret: str) -> None:
        self.socket_path = socket_path
        self.secret = secret
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=STREAM_LIMIT)
        except OSError as exc:
            raise SandboxClosedError(
                f"cannot reach the sandbox's execution server at {self.socket_path}: {exc}; "
                "the sandbox was closed or its process died (see server.log next to the socket)"
            ) from exc
        writer.write(orjson.dumps({"auth": self.secret}) + b"\n")
        answer = orjson.loads(await reader.readline() or b"{}")
        if not answer.get("ok"):
            writer.close()
            raise SandboxClosedError(f"execution server refused us: {answer.get('error', 'no answer')}")
        return reader, writer

    async def call(self, tool: str, args: dict[str, Any], *, fresh: bool = False) -> dict[str, Any]:
        """One request; `fresh` uses its own connection (to interrupt a call in progress)."""
        if fresh:
            reader, writer = await self._connect()
            try:
                return await self._roundtrip(reader, writer, tool, args)
            finally:
                writer.close()
        async with self._lock:
            if self._writer is None or self._writer.is_closing():
                self._reader, self._writer = await self._connect()
            assert self._reader is not None
            try:
                return await self._roundtrip(self._reader, self._writer, tool, args)
            except BaseException:
                # A cancelled or failed call leaves the stream mid-answer: start over next time.
                self._writer.close()
                self._writer = None
                raise

    async def _roundtrip(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tool: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        request_id = next(self._ids)
        try:
            writer.write(orjson.dumps({"id": request_id, "tool": tool, "args": args}) + b"\n")
            await writer.drain()
            line = await reader.readline()
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise SandboxClosedError(f"lost the sandbox's execution server during {tool}: {exc}") from exc
        if not line:
            raise SandboxClosedError(f"the sandbox's execution server closed the connection during {tool}")
        reply: dict[str, Any] = orjson.loads(line)
        if not reply.get("ok"):
            return {"error": reply.get("error", "unknown server error")}
        return reply.get("result") or {}

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

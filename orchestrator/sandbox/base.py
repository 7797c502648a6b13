"""The Sandbox interface every runtime provides, with the tools built on one `call`."""

from __future__ import annotations

import abc
import base64
import os
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from orchestrator.sandbox.results import BashResult, PythonResult, ToolResult


class Sandbox(abc.ABC):
    """A started sandbox. Tool methods never raise for tool failures: see `error` on results.

    They raise SandboxClosedError when the sandbox itself is gone.
    """

    kind: str = ""

    @abc.abstractmethod
    def descriptor(self) -> dict[str, Any]:
        """JSON-serialisable; `attach_sandbox(descriptor)` re-attaches from this node."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Graceful stop, then kill; verified gone on return. Idempotent."""

    @abc.abstractmethod
    async def call(self, tool: str, args: dict[str, Any], *, fresh: bool = False) -> dict[str, Any]:
        """One raw request to the execution server."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...

    # -- tools --------------------------------------------------------------------
    async def bash(
        self,
        command: str,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        max_output: int | None = None,
    ) -> BashResult:
        """Run `command` in the sandbox's persistent shell (cd and variables persist).

        `timeout` bounds the command, `idle_timeout` bounds a stretch without output; either
        interrupts it with ^C. stdin is /dev/null. Long output keeps its head and tail.
        """
        args = {"command": command, "timeout": timeout, "idle_timeout": idle_timeout,
                "max_output": max_output}
        return BashResult.from_reply(await self.call("bash", args))

    async def python(
        self, code: str, *, timeout: float | None = None, max_output: int | None = None
    ) -> PythonResult:
        """Run `code` in a persistent interpreter; the last expression's repr is `result`."""
        args = {"code": code, "timeout": timeout, "max_output": max_output}
        return PythonResult.from_reply(await self.call("python", args))

    async def warm(self, tools: Sequence[str]) -> int | None:
        """Start the named tools that start on first use (python) now, so they boot while the
        caller goes on; the python interpreter's pid when it was among them."""
        reply = await self.call("warm", {"tools": list(tools)})
        pid = reply.get("python")
        return int(pid) if pid is not None else None

    async def interrupt(self, tool: str = "bash") -> None:
        """Interrupt the bash or python call in progress (from another task)."""
        await self.call("interrupt", {"tool": tool}, fresh=True)

    async def edit(
        self,
        command: str,
        path: str,
        *,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: tuple[int, int] | list[int] | None = None,
    ) -> ToolResult:
        """view | create | str_replace | insert | undo on `path` (relative to /workspace)."""
        args: dict[str, Any] = {"command": command, "path": path}
        for key, value in (("file_text", file_text), ("old_str", old_str), ("new_str", new_str),
                           ("insert_line", insert_line)):
            if value is not None:
                args[key] = value
        if view_range is not None:
            args["view_range"] = list(view_range)
        return ToolResult.from_reply(await self.call("editor", args))

    async def upload(
        self, source: str | os.PathLike[str] | bytes, destination: str, *, mode: int | None = None
    ) -> ToolResult:
        """Copy a host file (or bytes) to `destination` in the sandbox."""
        if isinstance(source, bytes):
            data = source
        else:
            path = Path(source)
            data = path.read_bytes()
            if mode is None:
                mode = path.stat().st_mode & 0o777
        args = {"command": "upload", "path": destination,
                "data": base64.b64encode(data).decode("ascii"), "mode": mode}
        return ToolResult.from_reply(await self.call("files", args))

    async def download(
        self, source: str, destination: str | os.PathLike[str] | None = None
    ) -> ToolResult:
        """Fetch `source` from the sandbox: bytes in `.content`, also written to `destination`."""
        reply = await self.call("files", {"command": "download", "path": source})
        if reply.get("error"):
            return ToolResult.from_reply(reply)
        data = base64.b64decode(reply.pop("data", ""))
        if destination is not None:
            target = Path(destination)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return ToolResult(output=f"{len(data)} bytes from {reply.get('path')}", error=None,
                          data=reply, content=data)

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

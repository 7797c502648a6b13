"""What tools return. Tool failures are results with `error` set, never exceptions."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class BashResult:
    output: str
    exit_code: int | None
    timed_out: bool = False
    interrupted: bool = False
    truncated: bool = False
    signal: str | None = None          # e.g. SIGXCPU when the command died of a signal
    limit: str | None = None           # memory | cpu_time | file_size | processes, when recognised
    shell_restarted: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> "BashResult":
        return cls(
            output=reply.get("output", ""),
            exit_code=reply.get("exit_code"),
            timed_out=bool(reply.get("timed_out")),
            interrupted=bool(reply.get("interrupted")),
            truncated=bool(reply.get("truncated")),
            signal=reply.get("signal"),
            limit=reply.get("limit"),
            shell_restarted=bool(reply.get("shell_restarted")),
            error=reply.get("error"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PythonResult:
    stdout: str
    stderr: str
    result: str | None                 # repr() of the cell's last expression
    error: str | None                  # the traceback, or a message about the interpreter
    timed_out: bool = False
    interrupted: bool = False
    restarted: bool = False            # the interpreter was replaced: earlier state is gone
    limit: str | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> "PythonResult":
        return cls(
            stdout=reply.get("stdout", ""),
            stderr=reply.get("stderr", ""),
            result=reply.get("result"),
            error=reply.get("error"),
            timed_out=bool(reply.get("timed_out")),
            interrupted=bool(reply.get("interrupted")),
            restarted=bool(reply.get("restarted")),
            limit=reply.get("limit"),
            truncated=bool(reply.get("stdout_truncated") or reply.get("stderr_truncated")),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ToolResult:
    """Editor and file results: `output` for people, `data` for the raw reply."""

    output: str
    error: str | None
    data: dict[str, Any]
    content: bytes | None = None       # downloaded bytes

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> "ToolResult":
        return cls(output=reply.get("output", ""), error=reply.get("error"), data=reply)

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "error": self.error}

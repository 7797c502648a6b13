"""The standard tools bound to one sandbox: a tool call in, an observation and a record out.

Every call is bounded (`timeout`, interrupted inside the sandbox when it expires) and its
output is cut head + tail. Tool failures (non-zero exit, a traceback, a bad edit) are
observations the model reads; only a sandbox that is gone raises (SandboxClosedError).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.agent.calls import ToolCall
from orchestrator.agent.messages import DEFAULT_MAX_OBSERVATION_CHARS, cut_middle
from orchestrator.agent.tools import ToolSpec, check_arguments

if TYPE_CHECKING:
    from orchestrator.sandbox.base import Sandbox

# The sandbox enforces the timeout itself; this margin only guards against a hung server.
GUARD_MARGIN_S = 15.0
# The sandbox's own head + tail cut (orchestrator/sandbox/server/tools/output.py) says what it dropped.
SANDBOX_CUT = re.compile(r"\[\.\.\. (\d+) characters truncated \.\.\.\]")
EDITOR_COMMANDS = {"view": "view", "create": "create", "str_replace": "str_replace",
                   "insert": "insert", "undo_edit": "undo"}


@dataclass(frozen=True)
class ToolOutcome:
    observation: str
    exit_code: int | None = 0
    error: str | None = None
    output_chars: int = 0              # before cutting
    ends_episode: bool = False
    answer: str | None = None          # submit's answer
    summary: str | None = None         # summarize's summary: the loop replaces earlier turns by it


class SandboxToolbox:
    def __init__(self, sandbox: "Sandbox", specs: tuple[ToolSpec, ...],
                 max_output_chars: int = DEFAULT_MAX_OBSERVATION_CHARS) -> None:
        self.sandbox = sandbox
        self.specs = {spec.name: spec for spec in specs}
        self.max_output_chars = max_output_chars

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    def problems(self, call: ToolCall) -> list[str]:
        """Why `call` cannot run (unknown tool, bad arguments); empty when it can."""
        spec = self.specs.get(call.name)
        if spec is None:
            return [f"unknown tool {call.name!r}; available tools: {', '.join(self.specs)}"]
        return check_arguments(spec, call.arguments)

    async def execute(self, call: ToolCall, timeout: float) -> ToolOutcome:
        problems = self.problems(call)
        if problems:
            text = f"invalid call of {call.name}: " + "; ".join(problems)
            return ToolOutcome(f"Error: {text}", exit_code=None, error=text)
        method = self._implementations().get(call.name)
        if method is None:  # a declared tool without an implementation here
            text = f"tool {call.name!r} has no implementation in this sandbox toolbox"
            return ToolOutcome(f"Error: {text}", exit_code=None, error=text)
        try:
            # asyncio.timeout, not wait_for: no task per call (3.11's wait_for makes one).
            async with asyncio.timeout(timeout + GUARD_MARGIN_S):
                outcome: ToolOutcome = await method(call.arguments, timeout)
        except TimeoutError:
            await self._interrupt(call.name)
            text = f"{call.name} did not answer within {timeout:.0f} s and was interrupted"
            return ToolOutcome(f"Error: {text}", exit_code=None, error="timeout")
        return outcome

    def _implementations(self) -> dict[str, Any]:
        return {"bash": self._bash, "python": self._python, "str_replace_editor": self._str_replace_editor,
                "think": self._think, "submit": self._submit, "finish": self._finish_task,
                "summarize": self._summarize}

    async def _interrupt(self, name: str) -> None:
        if name in ("bash", "python"):
            try:
                await self.sandbox.interrupt(name)
            except Exception:  # the sandbox may be gone; the next call will say so
                pass

    def _result(self, text: str, exit_code: int | None, error: str | None = None) -> ToolOutcome:
        shown, _ = cut_middle(text, self.max_output_chars)
        dropped = sum(int(n) for n in SANDBOX_CUT.findall(text))
        return ToolOutcome(shown, exit_code=exit_code, error=error, output_chars=len(text) + dropped)

    # -- the tools -----------------------------------------------------------------------------
    async def _bash(self, args: dict[str, Any], timeout: float) -> ToolOutcome:
        result = await self.sandbox.bash(args["command"], timeout=timeout, max_output=self.max_output_chars)
        notes = []
        if result.timed_out:
            notes.append(f"[the command timed out after {timeout:g} s and was interrupted]")
        if result.error:
            notes.append(f"[{result.error}]")
        notes.append(f"[exit code {result.exit_code}]")
        text = result.output.rstrip("\n") + ("\n" if result.output.strip() else "") + "\n".join(notes)
        error = "timeout" if result.timed_out else result.error
        return self._result(text, result.exit_code, error)

    async def _python(self, args: dict[str, Any], timeout: float) -> ToolOutcome:
        result = await self.sandbox.python(args["code"], timeout=timeout, max_output=self.max_output_chars)
        parts = [result.stdout.rstrip("\n")] if result.stdout else []
        if result.stderr:
            parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
        if result.result is not None:
            parts.append(result.result)
        if result.error:
            parts.append(result.error.rstrip("\n"))
        if result.timed_out:
            parts.append(f"[the code timed out after {timeout:g} s and was interrupted]")
        text = "\n".join(parts) or "[no output]"
        error = "timeout" if result.timed_out else (result.error.strip().splitlines()[-1] if result.error else None)
        return self._result(text, 0 if result.ok else 1, error)

    async def _str_replace_editor(self, args: dict[str, Any], timeout: float) -> ToolOutcome:
        options = {k: args[k] for k in ("file_text", "old_str", "new_str", "insert_line", "view_range") if k in args}
        result = await self.sandbox.edit(EDITOR_COMMANDS[args["command"]], args["path"], **options)
        if result.error:
            return self._result(f"Error: {result.error}", 1, result.error)
        return self._result(result.output, 0)

    async def _think(self, args: dict[str, Any], timeout: float) -> ToolOutcome:
        return ToolOutcome("Your thought has been noted.", exit_code=0)

    async def _summarize(self, args: dict[str, Any], timeout: float) -> ToolOutcome:
        return ToolOutcome("Summary noted: earlier turns are replaced by it.", exit_code=0, summary=str(args["summary"]))

    async def _submit(self, args: dict[str, Any], timeout: float) -> ToolOutcome:
        return ToolOutcome("Answer submitted.", exit_code=0, ends_episode=True, answer=str(args.get("answer", "")))

    async def _finish_task(self, args: dict[str, Any], timeout: float) -> ToolOutcome:
        return ToolOutcome("Task finished.", exit_code=0, ends_episode=True, answer=args.get("message"))


"""The python tool: a persistent interpreter with captured output, timeouts and interrupts."""

from __future__ import annotations

from typing import Any

from orchestrator.spool.paths import SpoolPaths
from tests.sandbox.helpers import needs_bwrap, with_sandbox

pytestmark = needs_bwrap


def test_state_survives_between_calls(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        return [await sb.python("import math\nvalue = math.sqrt(16)"), await sb.python("value * 2")]

    first, second = with_sandbox(spool, body)
    assert first.ok and first.result is None
    assert second.result == "8.0"


def test_stdout_stderr_and_subprocess_output_are_captured(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> Any:
        return await sb.python("import os, sys\nprint('out')\nprint('err', file=sys.stderr)\nos.system('echo from-shell')")

    result = with_sandbox(spool, body)
    assert "out\n" in result.stdout and "from-shell\n" in result.stdout
    assert result.stderr == "err\n" and result.result == "0"


def test_exceptions_and_system_exit_are_results(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        return [await sb.python("def f():\n    raise ValueError('bad input')\nf()"),
                await sb.python("raise SystemExit(3)"), await sb.python("1 + 1"),
                await sb.python("def broken(:")]

    raised, exited, alive, syntax = with_sandbox(spool, body)
    assert "ValueError: bad input" in raised.error and "line 2, in f" in raised.error
    assert "SystemExit" in exited.error and alive.result == "2"
    assert "SyntaxError" in syntax.error


def test_timeout_interrupts_but_keeps_state(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        await sb.python("kept = 'yes'")
        return [await sb.python("import time\nwhile True: time.sleep(0.01)", timeout=0.5),
                await sb.python("kept")]

    slow, after = with_sandbox(spool, body)
    assert slow.timed_out and slow.interrupted and "KeyboardInterrupt" in slow.error
    assert after.result == "'yes'" and not after.restarted


def test_interpreter_death_restarts_with_empty_state(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        await sb.python("z = 1")
        return [await sb.python("import os\nos._exit(9)"), await sb.python("'z' in globals()")]

    died, fresh = with_sandbox(spool, body)
    assert died.restarted and "exited with 9" in died.error
    assert fresh.result == "False"


def test_interrupt_from_another_task(spool: SpoolPaths) -> None:
    import asyncio

    async def body(sb: Any) -> list[Any]:
        await sb.python("counter = 0")
        call = asyncio.create_task(sb.python("import time\nwhile True:\n    counter += 1\n    time.sleep(0.001)", timeout=60))
        await asyncio.sleep(0.5)
        await sb.interrupt("python")
        return [await call, await sb.python("counter > 0")]

    interrupted, state = with_sandbox(spool, body)
    assert interrupted.interrupted and not interrupted.timed_out and "KeyboardInterrupt" in interrupted.error
    assert state.result == "True"


def test_imports_resolve_from_the_workspace_like_python3(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> Any:
        await sb.edit("create", "files.py", file_text="WHO = 'the workspace module'\n")
        return await sb.python("import files\nfiles.WHO")

    imported = with_sandbox(spool, body)
    assert imported.result == "'the workspace module'", imported


def test_a_warmed_interpreter_is_started_at_once_and_runs_the_first_call(spool: SpoolPaths) -> None:
    """An agent whose tools include python warms it at INIT: the interpreter boots (~0.1-0.2 s on 2
    busy cores) while the first LLM turn generates, not when the first call comes."""
    async def body(sb: Any) -> tuple[int | None, Any]:
        warmed = await sb.warm(["python", "bash", "no-such-tool"])
        return warmed, await sb.python("import os\nos.getpid()")

    warmed, first = with_sandbox(spool, body)
    assert warmed is not None and first.result == str(warmed)

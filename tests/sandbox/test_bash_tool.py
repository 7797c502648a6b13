"""The bash tool: a persistent shell with robust completion detection, timeouts, truncation."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.spool.paths import SpoolPaths
from tests.sandbox.helpers import needs_bwrap, with_sandbox

pytestmark = needs_bwrap


def test_exit_codes_and_state_persist(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        return [await sb.bash(c) for c in ("cd /tmp && export A=1 && B=2", "echo $PWD $A $B", "false", "exit_code() { return 7; }; exit_code")]

    _, state, failed, seven = with_sandbox(spool, body)
    assert state.output == "/tmp 1 2\n" and state.exit_code == 0
    assert failed.exit_code == 1 and failed.output == ""
    assert seven.exit_code == 7


def test_multiline_heredoc_and_quotes(spool: SpoolPaths) -> None:
    command = "cat <<'EOF' > f.txt\nline one\n  'quoted' \"double\" $HOME\nEOF\nif true; then\n  wc -l < f.txt\nfi"

    async def body(sb: Any) -> Any:
        return await sb.bash(command)

    result = with_sandbox(spool, body)
    assert result.exit_code == 0 and result.output.strip() == "2"


def test_command_reading_stdin_gets_eof_instead_of_hanging(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        return [await sb.bash("cat", timeout=10), await sb.bash("read x; echo got=$x status=$?", timeout=10)]

    cat, read = with_sandbox(spool, body)
    assert cat.exit_code == 0 and not cat.timed_out
    assert read.output == "got= status=1\n"


def test_background_job_does_not_block_completion(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        return [await sb.bash("(sleep 30; echo late) > bg.log 2>&1 &", timeout=10),
                await sb.bash("echo next; jobs | wc -l")]

    background, after = with_sandbox(spool, body)
    assert background.exit_code == 0 and not background.timed_out
    assert after.output.startswith("next\n")


def test_timeout_interrupts_and_shell_survives(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        await sb.bash("X=kept")
        slow = await sb.bash("echo start; sleep 30; echo never", timeout=0.5)
        return [slow, await sb.bash("echo $X")]

    slow, after = with_sandbox(spool, body)
    assert slow.timed_out and slow.interrupted and slow.exit_code == 130
    assert "start" in slow.output and "never" not in slow.output
    assert after.output == "kept\n" and not after.shell_restarted


def test_idle_timeout_stops_a_silent_command(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> Any:
        return await sb.bash("echo a; sleep 30", timeout=60, idle_timeout=0.5)

    result = with_sandbox(spool, body)
    assert result.timed_out and result.output.startswith("a")


def test_interrupt_from_another_task(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> Any:
        call = asyncio.create_task(sb.bash("sleep 30", timeout=60))
        await asyncio.sleep(0.3)
        await sb.interrupt("bash")
        return await call

    result = with_sandbox(spool, body)
    assert result.interrupted and not result.timed_out and result.exit_code == 130


def test_long_output_keeps_head_and_tail(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> Any:
        return await sb.bash("seq 1 100000", max_output=2000)

    result = with_sandbox(spool, body)
    assert result.truncated and result.exit_code == 0
    assert result.output.startswith("1\n2\n3\n") and result.output.endswith("99999\n100000\n")
    assert "characters truncated" in result.output and len(result.output) < 2200


def test_exit_restarts_a_fresh_shell(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        await sb.bash("Y=1")
        return [await sb.bash("exit 3"), await sb.bash("echo y=$Y")]

    exited, fresh = with_sandbox(spool, body)
    assert exited.exit_code == 3 and exited.shell_restarted and exited.error
    assert fresh.output == "y=\n" and fresh.exit_code == 0


def test_bad_arguments_come_back_as_errors(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        return [await sb.call("bash", {}), await sb.call("nope", {}), await sb.bash("echo still fine")]

    missing, unknown, fine = with_sandbox(spool, body)
    assert "command" in missing["error"]
    assert "unknown tool" in unknown["error"]
    assert fine.output == "still fine\n"


def test_sandbox_default_command_timeout_applies(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        return [await sb.bash("sleep 30"), await sb.python("import time\ntime.sleep(30)")]

    bash, python = with_sandbox(spool, body, command_timeout_s=0.5)
    assert bash.timed_out and bash.exit_code == 130
    assert python.timed_out and "KeyboardInterrupt" in (python.error or "")


def test_commands_that_change_the_prompt_do_not_break_completion(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        return [await sb.bash("PS1='$ '; PS2='> '", timeout=10), await sb.bash("(exit 5)", timeout=10),
                await sb.bash("python3 -m venv /tmp/v && . /tmp/v/bin/activate && echo $VIRTUAL_ENV", timeout=60),
                await sb.bash("echo after", timeout=10)]

    changed, five, venv, after = with_sandbox(spool, body)
    assert not changed.timed_out and five.exit_code == 5
    assert venv.output == "/tmp/v\n" and after.output == "after\n"


def test_syntax_errors_return_at_once_and_long_commands_work(spool: SpoolPaths) -> None:
    body_text = ("y" * 99 + "\n") * 300     # 30 KB: far beyond a tty's 4 KiB line limit

    async def body(sb: Any) -> list[Any]:
        results = [await sb.bash(c, timeout=30) for c in ("echo (", "echo 'unclosed", "if true; then echo x")]
        results.append(await sb.bash(f"cat > big.txt <<'EOF'\n{body_text}EOF\nwc -c < big.txt", timeout=30))
        results.append(await sb.bash("printf '%s|' \"tab\there\" 'quote'\"'\"'s' '\\\\back'", timeout=30))
        return results

    *syntax, long, quoting = with_sandbox(spool, body)
    for result in syntax:
        assert result.exit_code == 2 and not result.timed_out, result
    assert long.output == f"{len(body_text)}\n" and long.exit_code == 0
    assert quoting.output == "tab\there|quote's|\\\\back|", quoting


def test_output_of_background_jobs_between_calls_is_kept(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> Any:
        await sb.bash("(sleep 0.2; echo from-background) &")
        await asyncio.sleep(0.6)
        return await sb.bash("echo now")

    result = with_sandbox(spool, body)
    assert "from-background\n" in result.output and result.output.endswith("now\n")

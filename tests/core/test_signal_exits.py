"""Every long-running command ends the documented way on SIGINT, SIGTERM and SIGHUP (issue 39,
item 2): exit status 130 (orchestrator/cli/exit_codes.py, the README's table), no traceback, and
`tail` prints its cursor, which resumes with exactly the rows it had not printed. Real command
processes, each in a session of its own, signalled as a terminal would (its process group);
`launch --wait` has its own tests (tests/core/test_launcher_signals.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import orjson
import pytest

from orchestrator.spool.paths import SpoolPaths
from orchestrator.submission.submit import submit_file
from tests.core.util import cli, make_run, rows, serve_in_process, write_jsonl

CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
INTERRUPTED = 130


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def signalled(process: subprocess.Popen[str], signum: int, timeout: float = 60) -> tuple[str, str]:
    """Send `signum` to the command's process group; what it printed after, once it has exited."""
    os.killpg(process.pid, signum)
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise


def read_lines(stream: IO[str] | None, count: int) -> list[str]:
    assert stream is not None
    return [stream.readline() for _ in range(count)]


def finished_jobs(paths: SpoolPaths, tmp_path: Path, name: str, count: int) -> set[str]:
    """Submit `count` echo jobs and run them to their rows: their job ids."""
    known = {row["job_id"] for row in rows(paths)}
    submit_file(paths, write_jsonl(tmp_path / f"{name}.jsonl", [{"handler": "echo", "instance": {"n": i}} for i in range(count)]))
    serve_in_process(paths)
    new = {row["job_id"] for row in rows(paths)} - known
    assert len(new) == count, new
    return new


def printed_jobs(stdout: str) -> list[str]:
    return [orjson.loads(line)["job_id"] for line in stdout.splitlines() if line.strip()]


def cursor_of(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("cursor: ")]
    assert len(lines) == 1, f"one cursor line on stderr: {stderr!r}"
    return lines[0].removeprefix("cursor: ")


def assert_interrupted(process: subprocess.Popen[str], stderr: str, signum: int) -> None:
    name = signal.Signals(signum).name
    assert process.returncode == INTERRUPTED, f"{name}: exit {process.returncode}, not 130: {stderr}"
    assert "Traceback" not in stderr and "Aborted!" not in stderr, stderr


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_tail_follow_exits_130_and_prints_a_cursor_that_resumes_with_the_rest(tmp_path: Path, signum: int) -> None:
    paths = make_run(tmp_path / "run")
    before = finished_jobs(paths, tmp_path, "before", 3)
    tail = start("tail", str(paths.root), "--follow", "--fields", "job_id,status", "--poll", "0.05")
    first = read_lines(tail.stdout, 3)   # it has printed every row there is: it is following now
    stdout, stderr = signalled(tail, signum)
    assert_interrupted(tail, stderr, signum)
    shown = printed_jobs("".join(first) + stdout)
    assert sorted(shown) == sorted(before), shown
    cursor = cursor_of(stderr)

    after = finished_jobs(paths, tmp_path, "after", 2)
    rest = cli("tail", str(paths.root), "--since", cursor, "--fields", "job_id")
    assert sorted(printed_jobs(rest.stdout)) == sorted(after), "the cursor resumes with exactly the rows not printed"


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_status_watch_exits_130(tmp_path: Path, signum: int) -> None:
    paths = make_run(tmp_path / "run")
    watch = start("status", str(paths.root), "--watch", "--json", "--interval", "0.2")
    read_lines(watch.stdout, 1)   # it is refreshing
    _, stderr = signalled(watch, signum)
    assert_interrupted(watch, stderr, signum)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_serve_llm_stops_cleanly_and_exits_130(signum: int) -> None:
    pytest.importorskip("torch")
    server = start("serve-llm", "--tiny", "--port", "0")
    (line,) = read_lines(server.stdout, 1)
    assert line.startswith("serving "), line
    _, stderr = signalled(server, signum)
    assert_interrupted(server, stderr, signum)
    assert "server stopped" in stderr, "it closed its listener and model first"


def test_serve_llm_stops_at_once_with_a_generation_in_flight() -> None:
    """A request generating when SIGTERM comes is aborted and answered with what it sampled, as
    vLLM does; the server waited for it to finish instead (35 s here, up to aiohttp's 60 s)."""
    pytest.importorskip("torch")
    import threading
    import time

    import httpx

    server = start("serve-llm", "--tiny", "--port", "0", "--max-model-len", "8192")
    (line,) = read_lines(server.stdout, 1)
    url = line.split()[-1]
    answers: list[dict] = []
    body = {"prompt": [1, 2, 3], "max_tokens": 8000, "ignore_eos": True}
    client = threading.Thread(target=lambda: answers.append(httpx.post(url + "/completions", json=body, timeout=120).json()))
    client.start()
    time.sleep(1.5)   # generating by now
    signalled_at = time.monotonic()
    _, stderr = signalled(server, signal.SIGTERM)
    took = time.monotonic() - signalled_at
    client.join(10)
    assert_interrupted(server, stderr, signal.SIGTERM)
    assert took < 10, f"serve-llm took {took:.1f} s to exit with a request in flight"
    (answer,) = answers
    assert answer["choices"][0]["finish_reason"] == "abort", answer["choices"][0]["finish_reason"]


def test_a_hangup_ignored_at_start_stays_ignored_as_under_nohup(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    watch = subprocess.Popen([*CLI, "status", str(paths.root), "--watch", "--json", "--interval", "0.1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    read_lines(watch.stdout, 1)
    os.killpg(watch.pid, signal.SIGHUP)
    read_lines(watch.stdout, 3)   # still refreshing
    assert watch.poll() is None, "nohup's SIGHUP ended the command"
    _, stderr = signalled(watch, signal.SIGTERM)
    assert_interrupted(watch, stderr, signal.SIGTERM)


def test_a_signal_while_the_cursor_is_written_waits_until_it_is_written() -> None:
    script = """
import os, signal
from orchestrator.cli.stop_signals import end_like_ctrl_c, signals_deferred
end_like_ctrl_c()
try:
    with signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        print("cursor: written whole", flush=True)
    print("not reached", flush=True)
except KeyboardInterrupt:
    print("then interrupted", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["cursor: written whole", "then interrupted"], done.stdout + done.stderr

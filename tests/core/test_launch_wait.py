"""`launch --wait`: the exit status says how the jobs ended (orchestrator/cli/exit_codes.py); the
progress counts are right."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.core.util import cli, make_run, rows, wait_until, write_jsonl

OK = {"handler": "sleep", "instance": {"run": 0.01}}
FAILING = {"handler": "sleep", "instance": {"run": 0.01, "fail": {"run": 1.0}}}


def launch_and_wait(paths, tasks_file: Path):  # type: ignore[no-untyped-def]
    cli("submit", str(paths.root), str(tasks_file))
    return cli("launch", str(paths.root), "--local", "--workers", "2", "--wait", check=False, timeout=300)


def test_wait_exits_non_zero_and_counts_when_jobs_failed(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    done = launch_and_wait(paths, write_jsonl(tmp_path / "t.jsonl", [OK] * 7 + [FAILING] * 3))
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "7 ok, 3 failed" in output and "hpc-rollout status" in output
    assert "10/10" in output and not re.search(r"\b1[1-9]/1\d\b", output), "never more done than submitted"
    assert re.search(r"ok 7 .*failed 3", output), "the bar shows ok and failed counts"
    assert len(rows(paths)) == 10


def test_wait_exits_zero_when_every_job_is_ok(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    done = launch_and_wait(paths, write_jsonl(tmp_path / "t.jsonl", [OK] * 5))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 ok" in done.stdout and "failed" not in done.stdout


def test_wait_exits_3_when_jobs_were_cancelled_by_the_user(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [OK] * 4)))
    cli("cancel", str(paths.root), "--all")
    done = cli("launch", str(paths.root), "--local", "--wait", check=False, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert "4 cancelled" in output and "were cancelled" in output, output
    assert sorted(row["status"] for row in rows(paths)) == ["cancelled"] * 4


def test_ctrl_c_on_any_command_exits_130_not_aborted(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    paths = make_run(tmp_path / "run")
    command = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
    tail = subprocess.Popen([*command, "tail", str(paths.root), "--follow"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watch = subprocess.Popen([*command, "status", str(paths.root), "--watch", "--json", "--interval", "0.2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watch.stdout is not None
    watch.stdout.readline()   # it is running its command (tail, started first, got as far meanwhile)
    time.sleep(3)
    for process in (watch, tail):
        process.send_signal(signal.SIGINT)
    _, watch_err = watch.communicate(timeout=30)
    _, tail_err = tail.communicate(timeout=30)
    assert watch.returncode == 130 and tail.returncode == 130, (watch_err, tail_err)
    assert "Aborted!" not in watch_err + tail_err and "Traceback" not in watch_err + tail_err
    assert "cursor:" in tail_err, "tail still prints where to resume"


def test_jobs_finished_before_the_bar_begins_still_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded node the launcher may draw its bar only after its workers ran every job: those
    jobs are the launch's all the same (CI once saw `0/1`, "0 ok" and exit 0 for 3 failed jobs)."""
    from click.testing import CliRunner

    from orchestrator.cli import cli as command_line
    from orchestrator.cli import launch as launch_command

    paths = make_run(tmp_path / "run")
    cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [OK] * 7 + [FAILING] * 3)))
    start = launch_command.start_local_workers

    def start_then_stall(*args: Any, **kwargs: Any) -> Any:   # fast workers, a launcher slow to go on
        launch = start(*args, **kwargs)
        wait_until(lambda: len(rows(paths)) == 10, 120, "the workers to commit every row")
        return launch

    monkeypatch.setattr(launch_command, "start_local_workers", start_then_stall)
    done = CliRunner().invoke(command_line, ["launch", str(paths.root), "--local", "--workers", "1", "--wait"])
    assert done.exit_code == 1, done.output
    assert "7 ok, 3 failed" in done.output

"""`launch --wait`: the exit status says whether every job ended ok; the progress counts are right."""

from __future__ import annotations

import re
from pathlib import Path

from tests.core.util import cli, make_run, rows, write_jsonl

OK = {"handler": "sleep", "instance": {"run": 0.01}}
FAILING = {"handler": "sleep", "instance": {"run": 0.01, "fail": {"run": 1.0}}}


def launch_and_wait(paths, tasks_file: Path):  # type: ignore[no-untyped-def]
    cli("submit", str(paths.root), str(tasks_file))
    return cli("launch", str(paths.root), "--local", "--workers", "2", "--wait", check=False, timeout=300)


def test_wait_exits_non_zero_and_counts_when_jobs_failed(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    done = launch_and_wait(paths, write_jsonl(tmp_path / "t.jsonl", [OK] * 7 + [FAILING] * 3))
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert "7 ok, 3 failed" in output and "hpc-rollout status" in output
    assert "10/10" in output and not re.search(r"\b1[1-9]/1\d\b", output), "never more done than submitted"
    assert re.search(r"ok 7 .*failed 3", output), "the bar shows ok and failed counts"
    assert len(rows(paths)) == 10


def test_wait_exits_zero_when_every_job_is_ok(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    done = launch_and_wait(paths, write_jsonl(tmp_path / "t.jsonl", [OK] * 5))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 ok" in done.stdout and "failed" not in done.stdout

"""Phase-aware time budgets and cancellation of jobs wherever they are."""

from __future__ import annotations

import json
import time
from pathlib import Path

from orchestrator.spool.cancel import request_cancel
from orchestrator.submission.submit import submit_file
from tests.core.util import (
    cli, drain_with_a_worker, make_run, rows, start_worker, stop_worker, wait_drained, wait_until, write_jsonl,
)


def test_budget_counts_stage_time_only(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"jobs.timeout_s": 1.0})
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [
        {"handler": "sleep", "instance": {"init": 0.3, "run": 0.3, "eval": 0.1, "reward": 1}},   # 0.7 s: fits
        {"handler": "sleep", "instance": {"init": 0.6, "run": 0.6, "reward": 2}},               # 1.2 s: over
    ]))
    time.sleep(1.5)  # queue time longer than the whole budget: must not count
    worker = start_worker(paths)
    try:
        wait_drained(paths)
    finally:
        stop_worker(worker)
    by_reward = {}
    for row in rows(paths):
        by_reward[row["status"]] = row
    ok, late = by_reward["ok"], by_reward["timeout"]
    assert ok["queue_s"] >= 1.5 and ok["counted_s"] < 1.0
    assert abs(ok["counted_s"] - (ok["init_s"] + ok["run_s"] + ok["eval_s"])) < 1e-6
    assert late["error_stage"] == "run" and "budget" in late["error"]
    assert 0.95 <= late["counted_s"] <= 1.5 and late["eval_s"] is None


def test_cancel_running_queued_group_and_all(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    long_run = {"handler": "sleep", "instance": {"run": 60}}
    submit_file(paths, write_jsonl(tmp_path / "a.jsonl", [long_run]))
    grouped = submit_file(paths, write_jsonl(tmp_path / "b.jsonl", [long_run]), samples=3)
    submit_file(paths, write_jsonl(tmp_path / "c.jsonl", [long_run] * 4))
    worker = start_worker(paths, "--run-pool", "2", "--init-pool", "1", "--max-prepared", "1")
    try:
        def running_jobs() -> list[str]:   # RUN started: a claimed job may still wait for a RUN slot
            return [e["job"] for log in paths.events.glob("*.jsonl")
                    for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "run_started"]

        wait_until(lambda: bool(running_jobs()), 30, "a job to run")
        running = running_jobs()[0]
        cli("cancel", str(paths.root), running)
        wait_until(lambda: len(rows(paths)) == 1, 30, "the cancelled row")
        row = rows(paths)[0]
        assert (row["job_id"], row["status"], row["error_stage"]) == (running, "cancelled", "run")
        assert row["run_s"] < 30

        group = grouped.first_job.rsplit("-", 1)[0]
        cli("cancel", str(paths.root), "--group", group)
        wait_until(lambda: sum(r["group_id"] == group for r in rows(paths)) == 3, 30, "the group's rows")
        cli("cancel", str(paths.root), "--all")
        wait_drained(paths, timeout=60)
    finally:
        assert stop_worker(worker) == 0
    got = rows(paths)
    assert len(got) == 1 + 3 + 4 and {r["status"] for r in got} == {"cancelled"}
    # a job submitted after `cancel --all` is not affected by it
    late = submit_file(paths, write_jsonl(tmp_path / "d.jsonl", [{"handler": "echo", "instance": {}}]))
    worker = start_worker(paths)
    try:
        wait_drained(paths)
    finally:
        stop_worker(worker)
    assert [r["status"] for r in rows(paths) if r["job_id"] == late.first_job] == ["ok"]


def test_cancel_cli_needs_a_target(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    result = cli("cancel", str(paths.root), check=False)
    assert result.returncode != 0 and "--group" in result.stderr
    assert request_cancel(paths, ("a-job",), ("g1",), True, check=False) == ["a-job", "group-g1", "ALL"]


def test_a_job_cancelled_before_its_worker_starts_is_not_run(tmp_path: Path) -> None:
    """A worker knows the cancel requests made before it started from its first claim on
    (test first: its view of cancel/ was empty until its first poll, 0.5 s in, and a quick job
    claimed meanwhile ran to an `ok` row)."""
    paths = make_run(tmp_path / "run")
    profile = {"init": 0.0, "run": 0.01, "eval": 0.01}
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 2))
    victim = report.first_job
    request_cancel(paths, (victim,))
    drain_with_a_worker(paths, timeout=120)
    status = {r["job_id"]: r["status"] for r in rows(paths)}
    assert status.pop(victim) == "cancelled" and list(status.values()) == ["ok"]


def test_a_cancel_all_of_the_older_format_cancels_nothing_rather_than_everything_to_come(tmp_path: Path) -> None:
    """cancel/ALL once held a time; read now it covers nothing (taking every submission recorded at
    each read would cancel all later ones too), until `cancel --all` rewrites it."""
    from orchestrator.spool.cancel import CancelWatch

    paths = make_run(tmp_path / "run")
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}]))
    paths.cancel.mkdir(exist_ok=True)
    (paths.cancel / "ALL").write_text("1795560000.000000\n")
    watch = CancelWatch(paths)
    watch.refresh()
    assert not watch.any and not watch.matches_name(report.first_job)
    request_cancel(paths, everything=True)
    watch.refresh()
    assert watch.submissions == {report.submission_id} and watch.matches_name(report.first_job)

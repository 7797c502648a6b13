"""The whole pipeline through real worker processes: rows, status, inspect, tail, launch/stop."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import orjson
import pyarrow.dataset as ds

from orchestrator.spool import fsops
from orchestrator.submission.submit import submit_file
from tests.core.util import (
    cli, drain_with_a_worker, make_run, rows, serve_in_process, start_worker, stop_worker, wait_drained,
    wait_until, write_jsonl,
)


def test_launch_wait_status_inspect_tail(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": i, "reward": i / 10}} for i in range(10)])
    cli("submit", str(paths.root), str(tasks), "--samples", "3")
    launched = cli("launch", str(paths.root), "--local", "--workers", "2", "--wait")
    assert "drained" in launched.stdout and "exit codes [0, 0]" in launched.stdout

    table = ds.dataset(paths.shards, format="parquet").to_table()
    assert table.num_rows == 30
    got = table.to_pylist()
    assert sorted(r["job_id"] for r in got) == sorted(set(r["job_id"] for r in got))
    assert {r["status"] for r in got} == {"ok"}
    by_group: dict[str, list[int]] = {}
    for row in got:
        by_group.setdefault(row["group_id"], []).append(row["sample_index"])
        assert row["reward"] == json.loads(row["instance"])["reward"]
        assert json.loads(row["result"])["echo"] == json.loads(row["instance"])
        assert row["counted_s"] >= 0 and row["queue_s"] >= 0 and row["node"] and row["worker"]
        assert row["attempt"] == 1 and row["error"] is None
    assert all(sorted(samples) == [0, 1, 2] for samples in by_group.values()) and len(by_group) == 10
    assert not list(paths.shards.glob("_tmp-*")), "no half-written shard may stay behind"

    status = json.loads(cli("status", str(paths.root), "--json").stdout)
    assert status["pending"] == 0 and status["finished"] == {"ok": 30}

    job = got[0]["job_id"]
    inspected = json.loads(cli("inspect", str(paths.root), job, "--json").stdout)
    events = [e["event"] for e in inspected["timeline"]]
    assert events[:2] == ["init_started", "init_finished"] and "run_finished" in events and events[-1] == "finished"
    assert inspected["instance"] == json.loads(got[0]["instance"]) and inspected["logs"]
    missing = cli("inspect", str(paths.root), "nope", check=False)
    assert missing.returncode != 0 and "no job 'nope'" in missing.stderr

    tailed = cli("tail", str(paths.root), "--fields", "job_id,status")
    lines = [orjson.loads(l) for l in tailed.stdout.splitlines()]
    assert len(lines) == 30 and set(lines[0]) == {"job_id", "status"}
    cursor = tailed.stderr.strip().split("cursor: ")[-1]
    assert cli("tail", str(paths.root), "--since", cursor).stdout == ""


def test_launch_without_wait_then_stop(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    cli("launch", str(paths.root), "--local", "--workers", "2")
    wait_until(lambda: len(list(paths.workers.glob("*.json"))) == 2, 30, "two heartbeats")
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 0.05}}] * 20)
    cli("submit", str(paths.root), str(tasks))
    wait_drained(paths)
    stopped = cli("stop", str(paths.root))
    assert "all workers stopped" in stopped.stdout
    assert not list(paths.workers.glob("*.json")) and len(list((paths.workers / "gone").glob("*.json"))) == 2
    assert len(rows(paths)) == 20


def test_failures_become_rows_with_reasons(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [
        {"handler": "sleep", "instance": {"fail": {"init": 1.0}}},
        {"handler": "sleep", "instance": {"fail": {"run": 1.0}}},
        {"handler": "sleep", "instance": {"fail": {"eval": 1.0}}},
        {"handler": "sleep", "instance": {"run": 0.01}},
    ])
    submit_file(paths, tasks)
    drain_with_a_worker(paths)
    by_stage = {r["error_stage"]: r for r in rows(paths)}
    assert set(by_stage) == {"init", "run", "eval", None}
    for stage in ("init", "run", "eval"):
        assert by_stage[stage]["status"] == "failed"
        assert "SleepFailure" in by_stage[stage]["error"] and f"{stage} failed on purpose" in by_stage[stage]["error"]
    assert by_stage[None]["status"] == "ok"
    assert by_stage["init"]["run_s"] is None  # a job failed in INIT never ran
    status = json.loads(cli("status", str(paths.root), "--json").stdout)
    assert status["finished"] == {"failed": 3, "ok": 1} and status["failure_reasons"]


def test_eval_only_workers_take_over_from_any_node(tmp_path: Path) -> None:
    """INIT+RUN on one worker, EVAL on another (as an eval-only array on a CPU partition would)."""
    paths = make_run(tmp_path / "run")
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"eval": 0.01}}] * 12))
    front = start_worker(paths, "--stages", "init,run")
    wait_until(lambda: len(list(paths.eval_queue.iterdir())) == 12, 30, "12 jobs waiting for EVAL")
    back = start_worker(paths, "--stages", "eval", env={"SLURMD_NODENAME": "cpu-node-7"})
    try:
        wait_drained(paths)
    finally:
        stop_worker(front), stop_worker(back)
    got = rows(paths)
    assert len(got) == 12 and {r["status"] for r in got} == {"ok"}
    assert len({r["worker"] for r in got}) == 1 and got[0]["worker"].startswith("cpu-node-7-")


def test_backpressure_stops_init_when_run_queue_is_full(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"jobs.batch_size": 1})   # one ticket per job: queue counts are jobs
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}] * 20))
    worker = start_worker(paths, "--run-pool", "0", "--init-pool", "4", "--max-prepared", "3")
    try:
        wait_until(lambda: bool(paths.run_queues()) and len(list(paths.run_queues()[0].iterdir())) == 3, 20, "3 prepared jobs")
        time.sleep(1.0)  # INIT must stay paused, not creep on
        assert len(list(paths.run_queues()[0].iterdir())) == 3
        assert len(list(paths.init_queue.iterdir())) == 17
    finally:
        assert stop_worker(worker) == 0
    # prepared jobs nobody ran go back to INIT when their worker leaves (their sandboxes die with it)
    assert len(list(paths.init_queue.iterdir())) == 20
    assert not any(any(q.iterdir()) for q in paths.run_queues())


def test_a_corrupt_ticket_is_quarantined_and_the_rest_runs(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}] * 5))
    (paths.init_queue / "00000000T000000000-dead-0000000-0000").write_bytes(b'{"job": truncated')
    worker = start_worker(paths)
    try:
        wait_drained(paths)
    finally:
        stop_worker(worker)
    assert len(rows(paths)) == 5
    kept = [p for p in paths.quarantine.iterdir() if not p.name.endswith(".reason")]
    assert len(kept) == 1 and kept[0].read_bytes() == b'{"job": truncated'
    reason = next(paths.quarantine.glob("*.reason")).read_text()
    assert "cannot decode ticket" in reason
    status = json.loads(cli("status", str(paths.root), "--json").stdout)
    assert any("quarantined" in w for w in status["warnings"])


def test_tail_follow_prints_rows_as_shards_land(tmp_path: Path) -> None:
    import subprocess
    import sys

    paths = make_run(tmp_path / "run")
    follower = subprocess.Popen([sys.executable, "-c", "from orchestrator.cli import main; main()", "tail",
                                 str(paths.root), "--follow", "--fields", "job_id", "--poll", "0.1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}] * 3))
        worker = start_worker(paths)
        try:
            wait_drained(paths)
        finally:
            stop_worker(worker)
        seen = [json.loads(follower.stdout.readline())["job_id"] for _ in range(report.jobs)]
    finally:
        follower.terminate()
        follower.wait(timeout=10)
    assert sorted(seen) == sorted(r["job_id"] for r in rows(paths))


def test_jobs_prepared_for_busy_run_slots_wait_in_memory_not_in_the_spool(tmp_path: Path) -> None:
    """With every RUN slot busy, what INIT prepared waits in the worker's memory (its claim,
    still saying INIT, stays on disk for recovery) instead of a trip through the node's run
    queue: no ticket save, hand-off rename or second claim per job (docs/scale.md)."""
    paths = make_run(tmp_path / "run")
    profile = {"init": 0.01, "run": 0.15, "eval": 0.01}
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 12))
    before = Counter(fsops.BY_DUTY)
    serve_in_process(paths, init_pool=2, run_pool=1, eval_pool=1, max_prepared=2)
    spent = Counter(fsops.BY_DUTY)
    spent.subtract(before)
    got = rows(paths)
    assert sorted(Counter(r["job_id"] for r in got).values()) == [1] * 12
    assert {r["status"] for r in got} == {"ok"} and {r["attempt"] for r in got} == {1}
    # per job: the claim (a rename, a share of a listing), the ticket read, the RUN output saved
    # before EVAL (create, flush, rename); the run-queue path added a save, a rename and a claim
    per_job = (spent[fsops.JOB_DUTY] + spent["claim"]) / 12
    assert per_job <= 6.5, dict(spent)
    assert not any(any(q.iterdir()) for q in paths.run_queues())

"""On a large run a worker learns what concerns everyone from the cluster summary, not by polling.

A real worker process among simulated live workers (heartbeats kept fresh by the test, more
than the 16 of orchestrator/cluster.py LARGE_RUN_WORKERS) rebuilds `control/cluster.json` and
reads it: cancel requests, the stop request and dead workers reach it through the summary, and
its own polls of cancel/, control/stop, the heartbeats and its empty queues stop (counted by
fsops per duty in its heartbeat).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from orchestrator.claims import ClaimBox
from orchestrator.cluster import LARGE_RUN_WORKERS, Summary
from orchestrator.jobs import JobSpec, Stage
from orchestrator.paths import SpoolPaths
from orchestrator.submit import submit_file
from orchestrator.tickets import Ticket
from tests.core.util import cli, make_run, rows, start_worker, stop_worker, wait_until, write_jsonl

LARGE = {"leases.heartbeat_s": 0.5, "leases.lease_s": 6.0, "llm.view_s": 0.5}
PEERS = LARGE_RUN_WORKERS + 4
ME = "real-1-abcd"


@pytest.fixture
def peers_alive(tmp_path: Path) -> Iterator[SpoolPaths]:
    """A run whose PEERS simulated workers stay alive (their heartbeats touched) while the test runs."""
    paths = make_run(tmp_path / "run", **LARGE)
    beats = [paths.heartbeat(f"peer{i:02d}-1-beef") for i in range(PEERS)]
    for index, beat in enumerate(beats):
        beat.write_bytes(orjson.dumps({"node": f"peer{index:02d}", "state": "running"}))
    done = threading.Event()

    def keep_alive() -> None:
        while not done.wait(0.5):
            for beat in beats:
                os.utime(beat)

    thread = threading.Thread(target=keep_alive, daemon=True)
    thread.start()
    yield paths
    done.set()
    thread.join()


def summary(paths: SpoolPaths) -> Summary | None:
    try:
        return Summary.from_json(orjson.loads(paths.cluster_summary.read_bytes()))
    except (OSError, ValueError):
        return None


def duty_ops(paths: SpoolPaths, *duties: str) -> dict[str, int]:
    """The real worker's metadata operations so far, by duty (from its heartbeat)."""
    beat = paths.heartbeat(ME) if paths.heartbeat(ME).exists() else paths.workers / "gone" / f"{ME}.json"
    by_duty = orjson.loads(beat.read_bytes()).get("fs_ops_by_duty", {})
    return {duty: by_duty.get(duty, 0) for duty in duties}


def dead_worker_with_a_claim(paths: SpoolPaths, job_id: str) -> None:
    """A worker that died holding one claim: its heartbeat older than the lease."""
    dead = "dead00-1-beef"
    job = JobSpec(job_id=job_id, group_id=job_id, instance_id=job_id, sample_index=0, handler="echo", instance={})
    ClaimBox(paths, dead).save(Ticket(job=job, stage=Stage.INIT))
    paths.heartbeat(dead).write_bytes(orjson.dumps({"node": "deadnode", "state": "running"}))
    old = time.time() - 60
    os.utime(paths.heartbeat(dead), (old, old))


def test_cancel_stop_and_dead_workers_reach_a_large_run_through_the_summary(peers_alive: SpoolPaths,
                                                                           tmp_path: Path) -> None:
    paths = peers_alive
    report = submit_file(paths, write_jsonl(tmp_path / "long.jsonl", [{"handler": "sleep", "instance": {"run": 120}}]))
    worker = start_worker(paths, "--worker-id", ME, "--run-pool", "2", "--init-pool", "1", "--eval-pool", "1")
    try:
        wait_until(lambda: (s := summary(paths)) is not None and s.large and ME in s.workers, 60,
                   "the worker to rebuild the cluster summary")
        wait_until(lambda: any(paths.claims(ME).iterdir()), 60, "the long job to be claimed")
        time.sleep(2.0)   # a few beats: the heartbeat's counts are those of a summary reader
        quiet = ("cancel_poll", "stop_poll", "recovery", "idle_poll")
        before = duty_ops(paths, *quiet)
        time.sleep(6.0)   # polled directly, each would have run at least once (2 s, 5 s, 2 s, <= 2 s)
        assert duty_ops(paths, *quiet) == before

        dead_worker_with_a_claim(paths, "orphan-0000001-0000")
        wait_until(lambda: any(r["job_id"] == "orphan-0000001-0000" for r in rows(paths)), 60,
                   "the dead worker's job to be requeued and run")
        assert not paths.heartbeat("dead00-1-beef").exists()   # retired by the summary's rebuilder
        assert duty_ops(paths, "recovery") == {"recovery": before["recovery"]}   # no scan of its own

        # new work reaches the idle dispatchers through the summary (init queue not empty), and a
        # free slot asks the spool only when the summary or the worker's own work says there is
        # something: polling each queue as its slot frees would make 18 polls here
        idle_before = duty_ops(paths, "idle_poll")["idle_poll"]
        quick = submit_file(paths, write_jsonl(tmp_path / "quick.jsonl", [{"handler": "echo", "instance": {}}] * 6))
        wait_until(lambda: sum(r["job_id"].startswith(quick.submission_id) for r in rows(paths)) == 6, 60,
                   "six quick jobs to finish")
        time.sleep(1.5)   # the heartbeat after them
        assert duty_ops(paths, "idle_poll")["idle_poll"] - idle_before <= 6   # the init queue's end, at most

        cli("cancel", str(paths.root), report.first_job)
        wait_until(lambda: any(r["job_id"] == report.first_job for r in rows(paths)), 60, "the cancelled row")
        row = next(r for r in rows(paths) if r["job_id"] == report.first_job)
        assert (row["status"], row["error_stage"]) == ("cancelled", "run")

        cli("stop", str(paths.root), "--no-wait")
        assert worker.wait(timeout=60) == 0   # seen through the summary's stop_at
        assert duty_ops(paths, "stop_poll") == {"stop_poll": before["stop_poll"]}
    finally:
        stop_worker(worker)

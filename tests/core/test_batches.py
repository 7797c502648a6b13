"""Batched INIT tickets: one queue/init/ entry for several jobs, every job still ends exactly once."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.spool import fsops
from orchestrator.spool.batches import (batch_name, count_jobs, decode_batch, encode_batch, jobs_in, may_hold_job,
                                  may_hold_task, parse_batch_name)
from orchestrator.spool.cancel import CancelWatch, request_cancel
from orchestrator.spool.handoffs import HandoffLog, read_handoffs
from orchestrator.report.inspect_job import inspect_job
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.recovery import release_own_claims
from orchestrator.report.status import pending_count
from orchestrator.submission.submit import submit_file
from orchestrator.spool.tickets import CorruptTicket, Ticket
from tests.core.util import (cli, make_run, rows, serve_in_process, start_worker, stop_worker, wait_drained, wait_until,
                             write_jsonl)

SUB = "20261123T035425123-ab12"


def ticket(task: int, sample: int = 0) -> Ticket:
    job_id = f"{SUB}-{task:07d}-{sample:04d}"
    return Ticket(JobSpec(job_id=job_id, group_id=job_id[:-5], instance_id="i", sample_index=sample,
                          handler="echo", instance={}))


def test_a_batch_name_says_what_it_holds_and_its_content_must_agree() -> None:
    tickets = [ticket(3, s) for s in range(4)] + [ticket(4, 0)]
    name = batch_name(tickets[0].name, len(tickets))
    assert name == f"{SUB}-0000003-0000+5" and jobs_in(name) == 5 and jobs_in(tickets[0].name) == 1
    assert parse_batch_name(tickets[0].name) is None
    assert count_jobs([name, tickets[0].name]) == 6
    assert [t.name for t in decode_batch(encode_batch(tickets), name)] == [t.name for t in tickets]
    # the name narrows the batches a job or task can be in: never a miss
    assert may_hold_job(name, f"{SUB}-0000004-0000") and may_hold_task(name, SUB, 7)
    assert not may_hold_job(name, f"{SUB}-0000002-0005") and not may_hold_task(name, SUB, 8)
    assert not may_hold_job(name, "other-0000003-0001")
    for wrong_name in (batch_name(tickets[0].name, 4), batch_name(tickets[1].name, 5)):
        with pytest.raises(CorruptTicket, match="its name says"):
            decode_batch(encode_batch(tickets), wrong_name)
    with pytest.raises(CorruptTicket):
        decode_batch(b"{not json", name)


def test_the_cancel_sweep_recognises_batches_from_their_names(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    watch = CancelWatch(paths)
    name = batch_name(ticket(3).name, 8)
    assert not watch.matches_name(name)
    request_cancel(paths, (f"{SUB}-0000005-0000",), check=False)
    watch.refresh()
    assert watch.matches_name(name) and not watch.matches_name(batch_name(ticket(20).name, 8))


def test_submit_queues_batches_status_counts_jobs_and_inspect_finds_a_batched_job(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")   # jobs.batch_size 8, the default
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": i}} for i in range(5)]),
                         samples=4)
    names = sorted(os.listdir(paths.init_queue))
    assert report.jobs == 20 and report.batches == 3 == len(names)
    assert [jobs_in(n) for n in names] == [8, 8, 4] and names[0] == f"{report.first_job}+8"
    assert pending_count(paths) == 20
    from orchestrator.config import RunConfig
    from orchestrator.report.status import snapshot
    assert snapshot(paths, RunConfig.load(paths.run_config), with_rows=False).queued["init"] == 20
    middle = f"{report.submission_id}-0000002-0001"   # the 10th job: in the second batch
    found = inspect_job(paths, middle)
    assert found["where"] == f"queue/init/{names[1]} (a batch of 8 jobs)"
    assert found["instance"] == {"i": 2} and found["stage"] == "init" and found["attempt"] == 1
    shown = cli("inspect", str(paths.root), middle).stdout
    assert f"queue/init/{names[1]} (a batch of 8 jobs)" in shown
    said = cli("submit", str(paths.root), str(tmp_path / "t.jsonl"), "--samples", "2").stdout
    assert "= 10 job(s)" in said and "in 2 queue/init entries of up to 8 jobs (jobs.batch_size)" in said


def test_a_dead_workers_batch_returns_each_unresolved_job_once(tmp_path: Path) -> None:
    """Job 0: nothing happened; job 1: its own ticket was written (hand-off begun); job 2: handed
    off (recorded, renamed away); job 3: nothing. Recovery returns 0, 1 and 3, never 2."""
    paths = make_run(tmp_path / "run")
    tickets = [ticket(t) for t in range(4)]
    claims = paths.claims("dead-1-beef")
    claims.mkdir(parents=True)
    name = batch_name(tickets[0].name, 4)
    (claims / name).write_bytes(encode_batch(tickets))
    moved_on = Ticket.decode(tickets[1].encode())
    moved_on.mark_enqueued(Stage.EVAL)   # the newer state, saved before it would leave
    (claims / tickets[1].name).write_bytes(moved_on.encode())
    HandoffLog(claims).record(tickets[2].name)
    assert release_own_claims(paths, "dead-1-beef", 3, lambda *a: None) == 3
    assert sorted(os.listdir(paths.init_queue)) == [tickets[0].name, tickets[3].name]
    assert os.listdir(paths.eval_queue) == [tickets[1].name]
    assert not claims.exists()


def sleep_rows(run_s: list[float], eval_s: float = 0.05) -> list[dict]:
    return [{"handler": "sleep", "instance": {"init": 0.02, "run": r, "eval": eval_s}} for r in run_s]


def held_batches(paths, process) -> list[str]:
    return [n for d in paths.active.glob(f"*-{process.pid}-*") if d.is_dir() for n in os.listdir(d) if "+" in n]


def assert_exactly_once(paths, jobs: int) -> list[dict]:
    got = rows(paths)
    counts = Counter(r["job_id"] for r in got)
    assert len(counts) == jobs, "a job was lost"
    assert max(counts.values()) == 1, f"duplicated rows: {[j for j, c in counts.items() if c > 1]}"
    return got


def kill_mid_batch_then_drain(paths, victim, *steady_args: str) -> None:
    """SIGKILL `victim` once 3 to 7 of the 8 jobs have rows and it still holds their batch; then a
    worker started with `steady_args` drains the run (recovery returns the batch's other jobs)."""
    steady = None
    try:
        wait_until(lambda: len(rows(paths)) >= 3 and held_batches(paths, victim), 120, "rows of a batch still held")
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        assert 3 <= len(rows(paths)) < 8
        steady = start_worker(paths, *steady_args)
        wait_drained(paths, timeout=120)
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
        assert steady is None or stop_worker(steady) == 0


def test_sigkill_of_a_worker_holding_a_partly_committed_batch_ends_every_job_once(tmp_path: Path) -> None:
    # One batch of 8: four quick jobs commit (one row per shard), four slow ones are in flight.
    # EVAL has one slot, so some quick jobs leave through the eval queue (a hand-off).
    paths = make_run(tmp_path / "run", **{"shards.max_rows": 1})
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", sleep_rows([0.05] * 4 + [3.0] * 4, eval_s=0.2)))
    kill_mid_batch_then_drain(paths, start_worker(paths, "--init-pool", "8", "--run-pool", "8", "--eval-pool", "1"),
                              "--run-pool", "8")
    got = assert_exactly_once(paths, 8)
    assert {r["status"] for r in got} == {"ok"}
    assert max(r["attempt"] for r in got) == 2   # the slow ones were lost once
    assert not list(paths.quarantine.iterdir())


def test_sigkill_after_jobs_of_a_batch_were_handed_off_to_the_eval_queue(tmp_path: Path) -> None:
    # The victim has no EVAL: every job of its batch leaves as its own ticket through the
    # hand-off log. Killed with some handed off (and evaluated elsewhere) and some still running.
    paths = make_run(tmp_path / "run")
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", sleep_rows([0.05] * 4 + [3.0] * 4)))
    evaluator = start_worker(paths, "--stages", "eval")
    try:
        kill_mid_batch_then_drain(paths, start_worker(paths, "--stages", "init,run", "--init-pool", "8", "--run-pool", "8"),
                                  "--stages", "init,run")
    finally:
        assert stop_worker(evaluator) == 0
    got = assert_exactly_once(paths, 8)
    assert {r["status"] for r in got} == {"ok"}
    attempts = Counter(r["attempt"] for r in got)
    assert attempts[1] >= 3 and attempts[2] >= 1, attempts   # handed off before the kill: never again


def test_a_clean_stop_mid_batch_gives_unstarted_jobs_back_unchanged(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", sleep_rows([0.5] * 8)))
    worker = start_worker(paths, "--init-pool", "1", "--run-pool", "1", "--eval-pool", "1", "--max-prepared", "1")
    try:
        wait_until(lambda: len(rows(paths)) >= 1, 120, "a first row")
    finally:
        assert stop_worker(worker) == 0
    assert pending_count(paths) > 0 and not [d for d in paths.active.iterdir() if not d.name.startswith(".")]
    second = start_worker(paths)
    try:
        wait_drained(paths, timeout=120)
    finally:
        assert stop_worker(second) == 0
    got = assert_exactly_once(paths, 8)
    assert {r["status"] for r in got} == {"ok"} and {r["attempt"] for r in got} == {1}


def test_cancel_inside_a_queued_batch_and_inside_a_claimed_one(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    first = submit_file(paths, write_jsonl(tmp_path / "a.jsonl", sleep_rows([0.05] * 8)))
    queued_victim = f"{first.submission_id}-0000005-0000"
    request_cancel(paths, (queued_victim,))
    second = submit_file(paths, write_jsonl(tmp_path / "b.jsonl", sleep_rows([1.0] * 8)))
    claimed_victim = f"{second.submission_id}-0000007-0000"
    worker = start_worker(paths, "--init-pool", "1", "--run-pool", "1", "--eval-pool", "1", "--max-prepared", "1")
    try:
        wait_until(lambda: not os.listdir(paths.init_queue), 120, "both batches claimed")
        request_cancel(paths, (claimed_victim,))
        wait_drained(paths, timeout=120)
    finally:
        assert stop_worker(worker) == 0
    got = assert_exactly_once(paths, 16)
    status = {r["job_id"]: r["status"] for r in got}
    assert status.pop(queued_victim) == "cancelled" and status.pop(claimed_victim) == "cancelled"
    assert set(status.values()) == {"ok"}


def test_a_corrupt_batch_is_quarantined_and_the_other_batches_run(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}] * 12))
    corrupt = f"{SUB}-0000000-0000+4"
    (paths.init_queue / corrupt).write_bytes(b'{"tickets": [{"job": 1}]}')
    worker = start_worker(paths)
    try:
        wait_until(lambda: len(rows(paths)) == 12 and pending_count(paths) == 0, 120, "the good batches")
    finally:
        assert stop_worker(worker) == 0
    assert_exactly_once(paths, 12)
    quarantined = [p.name for p in paths.quarantine.iterdir()]
    assert any(n.startswith(corrupt) and not n.endswith(".reason") for n in quarantined)
    assert any(n.endswith(".reason") for n in quarantined)


def test_the_handoff_log_skips_torn_and_damaged_lines(tmp_path: Path) -> None:
    log = HandoffLog(tmp_path)
    log.record("job-a")
    with open(tmp_path / ".handoffs", "ab") as handle:   # an append a full disk cut short
        handle.write(b"handoff job-torn 1234")
    log.record("job-b")
    with open(tmp_path / ".handoffs", "ab") as handle:
        handle.write(b"\nhandoff job-c 00000000\n")         # a checksum that does not match
    log.close()
    assert read_handoffs(tmp_path) == {"job-a", "job-b"}


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("failing", ["sync_dir", "unlink"])
def test_an_error_after_a_shard_is_renamed_in_never_writes_its_rows_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str, batch_size: int) -> None:
    """Once a shard is renamed into shards/ its rows are committed: an OSError after the rename
    (flushing shards/, dropping a claim or an emptied batch file) must not put the rows back for
    the next shard. The claims it left are dropped later (or found committed by recovery)."""
    paths = make_run(tmp_path / "run", **{"shards.max_rows": 2})
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", sleep_rows([0.01] * 4, eval_s=0.01)), batch_size=batch_size)
    real = getattr(fsops, failing)
    failed: list[Path] = []

    def fail_once(path: Path, *args, **kwargs):
        in_claims = path.parent.parent == paths.active and not path.name.startswith(".")
        if not failed and (path == paths.shards if failing == "sync_dir" else in_claims):
            failed.append(path)
            raise OSError(28, "No space left on device (injected)", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fsops, failing, fail_once)
    serve_in_process(paths, timeout=120)
    assert failed, f"no {failing} after a shard was renamed in"
    assert_exactly_once(paths, 4)
    assert pending_count(paths) == 0

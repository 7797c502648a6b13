"""The worker's progress journal: a RUN output appended before this worker's own EVAL instead
of a ticket rewrite (docs/scale.md), and exactly once through crashes, stops and fencing."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchestrator.spool import fsops, journal
from orchestrator.spool.batches import queued_tickets
from orchestrator.report.inspect_job import inspect_job
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.journal import Journal, JournalEntry, RecordKind
from orchestrator.spool.recovery import release_own_claims
from orchestrator.submission.submit import submit_file
from orchestrator.spool.tickets import Ticket
from tests.core.test_cluster_summary import ME, peers_alive, summary  # noqa: F401 (a fixture)
from tests.core.util import (drain_with_a_worker, make_run, rows, serve_in_process, start_worker, stop_worker,
                             wait_drained, wait_until, write_jsonl)


def events(paths, event: str) -> list[dict[str, Any]]:
    found = []
    for log in paths.events.glob("*.jsonl"):
        found += [e for e in map(orjson.loads, log.read_bytes().splitlines()) if e["event"] == event]
    return found


def per_job(paths, event: str) -> Counter[str]:
    return Counter(e["job"] for e in events(paths, event))


def claim_dir_of(paths, process) -> Path | None:
    found = [d for d in paths.active.glob(f"*-{process.pid}-*") if d.is_dir()]
    return found[0] if found else None


def journal_record(job_id: str, attempt: int = 1, **body: Any) -> JournalEntry:
    return JournalEntry(RecordKind.RUN_OUTPUT, job_id, attempt, body)


def spec(job_id: str) -> JobSpec:
    return JobSpec(job_id=job_id, group_id=job_id, instance_id=job_id, sample_index=0, handler="sleep", instance={})


# -- the journal file ---------------------------------------------------------------------------

def test_a_torn_or_damaged_record_is_ignored_and_the_rest_read(tmp_path: Path) -> None:
    box = tmp_path / "claims"
    box.mkdir()
    log = Journal.open(box)
    for index in range(3):
        log.append(journal_record(f"j{index}", outputs={"run": {"n": index}}))
    log.append(journal_record("j1", attempt=2, outputs={"run": {"n": 10}}))   # later wins
    log.close()
    path = box / ".journal-000001"
    whole = path.read_bytes()
    lines = whole.split(b"\n")
    lines[0] = lines[0].replace(b'"n":0', b'"n":7')        # damaged: its checksum no longer matches
    torn = journal_record("j3").encode()[:-9]               # a crash mid-append
    path.write_bytes(b"\n".join(lines) + torn)
    read = journal.read(box)
    assert sorted(read) == ["j1", "j2"]
    assert (read["j1"].attempt, read["j1"].body) == (2, {"outputs": {"run": {"n": 10}}})
    assert fsops.list_names(box) == [], "the journal is never listed as a claim"


def test_an_append_is_a_data_flush_not_a_metadata_operation(tmp_path: Path) -> None:
    log = Journal.open(tmp_path)
    log.append(journal_record("first"))   # creates the file: one create
    ops, flushes = sum(fsops.OPS.values()), fsops.DATA["fdatasync"]
    for index in range(5):
        log.append(journal_record(f"j{index}"))
    assert sum(fsops.OPS.values()) == ops and fsops.DATA["fdatasync"] == flushes + 5
    log.close()


def test_rotation_keeps_live_entries_and_stays_bounded(tmp_path: Path) -> None:
    log = Journal.open(tmp_path, rotate_bytes=2048)
    biggest, live = 0, set()
    for index in range(400):
        job = f"job{index:04d}"
        live.add(job)
        log.append(journal_record(job, outputs={"run": {"text": "x" * 100}}))
        if len(live) > 5:                       # jobs committed: their claims are gone
            live.discard(min(live))
        if log.due():
            ops = sum(fsops.OPS.values())
            log.rotate(live)
            assert sum(fsops.OPS.values()) - ops == 2, "a rotation is a create and an unlink"
        files = journal.journal_files(os.listdir(tmp_path))
        assert len(files) == 1
        biggest = max(biggest, sum((tmp_path / f).stat().st_size for f in files))
    log.close()
    assert log.rotations >= 20 and biggest < 2048 + 300
    kept = set(journal.read(tmp_path))   # the live ones, and those appended since the last rotation
    assert live <= kept and len(kept) < 20


def test_a_rotation_that_fails_keeps_the_old_file_whole_and_is_tried_again(tmp_path: Path) -> None:
    log = Journal.open(tmp_path, rotate_bytes=100)
    log.append(journal_record("a", outputs={"run": {"x": 1}}))
    blocker = tmp_path / ".journal-000002"
    blocker.mkdir()                      # the new file's name is taken: its create fails
    try:
        log.rotate({"a"})
        raise AssertionError("the rotation should have failed")
    except OSError:
        pass
    blocker.rmdir()
    log.append(journal_record("b"))      # still appended to the first file
    assert journal.journal_files(os.listdir(tmp_path)) == [".journal-000001"] and set(journal.read(tmp_path)) == {"a", "b"}
    log.rotate({"b"})
    assert journal.journal_files(os.listdir(tmp_path)) == [".journal-000002"] and set(journal.read(tmp_path)) == {"b"}
    log.close()


def test_readers_take_every_journal_file_in_order(tmp_path: Path) -> None:
    """A crash between a rotation's create and unlink leaves two files; the later one wins."""
    old, new = tmp_path / ".journal-000009", tmp_path / ".journal-000010"
    old.write_bytes(journal_record("a", outputs={"v": 1}).encode() + journal_record("b").encode())
    new.write_bytes(journal_record("a", outputs={"v": 2}).encode())
    read = journal.read(tmp_path)
    assert read["a"].body == {"outputs": {"v": 2}} and "b" in read
    assert Journal.open(tmp_path).path.name == ".journal-000011"


# -- recovery ---------------------------------------------------------------------------------

def test_a_claim_left_at_a_clean_stop_goes_to_eval_with_its_journaled_run_output(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    box = paths.claims("w1")
    box.mkdir(parents=True)
    saved = Ticket(spec("job1"), stage=Stage.INIT)           # the claim as INIT read it
    (box / "job1").write_bytes(saved.encode())
    (box / "job2").write_bytes(Ticket(spec("job2"), stage=Stage.INIT, attempt=2).encode())
    done = Ticket(spec("job1"), stage=Stage.EVAL, outputs={"init": {"a": 1}, "run": {"b": 2}},
                  timings={"run_s": 1.5})
    log = Journal.open(box)
    log.append(JournalEntry(RecordKind.RUN_OUTPUT, "job1", 1, done.progress()))
    log.append(JournalEntry(RecordKind.RUN_OUTPUT, "job2", 1, done.progress()))  # an older attempt
    log.close()
    assert release_own_claims(paths, "w1", 3, lambda *a: None) == 2
    evaluated = Ticket.decode((paths.eval_queue / "job1").read_bytes(), "job1")
    assert evaluated.outputs == {"init": {"a": 1}, "run": {"b": 2}} and evaluated.timings["run_s"] == 1.5
    assert evaluated.stage is Stage.EVAL
    again = Ticket.decode((paths.init_queue / "job2").read_bytes(), "job2")
    assert again.outputs == {} and again.attempt == 3
    assert not box.exists(), "the journal goes with the claim directory"


def test_a_claim_requeued_after_an_engine_error_keeps_its_journaled_run_output(tmp_path: Path) -> None:
    """The engine requeues a claim it cannot carry on with its journal's entries in memory."""
    from orchestrator.spool.recovery import requeue_claim

    paths = make_run(tmp_path / "run")
    box = paths.claims("w1")
    box.mkdir(parents=True)
    (box / "job1").write_bytes(Ticket(spec("job1"), stage=Stage.RUN, node="n1").encode())
    ran = Ticket(spec("job1"), stage=Stage.EVAL, node="n1", outputs={"init": {}, "run": {"answer": 42}})
    entries = {"job1": JournalEntry(RecordKind.RUN_OUTPUT, "job1", 1, ran.progress())}
    assert requeue_claim(paths, box / "job1", "worker error in eval", 3, lambda *a: None, entries) == 1
    ticket = Ticket.decode((paths.eval_queue / "job1").read_bytes(), "job1")
    assert ticket.outputs["run"] == {"answer": 42} and ticket.attempt == 2


# -- real workers, real signals --------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 8])
def test_a_worker_killed_during_eval_resumes_at_eval_elsewhere_and_never_runs_again(tmp_path: Path, batch_size: int) -> None:
    """RUN outputs only in the journal (the claims, single tickets or one batch file, still say
    INIT) survive a SIGKILL during EVAL: another worker evaluates them without running RUN
    again. A record torn by the crash is ignored: that job alone runs again. One row each."""
    paths = make_run(tmp_path / "run", **{"jobs.batch_size": batch_size})
    profile = {"init": 0.01, "run": 0.05, "eval": 3.0}
    submitted = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 4))
    victim = start_worker(paths, "--run-pool", "4", "--eval-pool", "4")
    try:
        wait_until(lambda: len(per_job(paths, "eval_started")) == 4, 90, "four jobs in EVAL")
        box = claim_dir_of(paths, victim)
        assert box is not None
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
    claims = {ticket.name: ticket for ticket in queued_tickets(box)}   # batch files opened
    assert len(claims) == 4 and all(t.stage is Stage.INIT and "run" not in t.outputs for t in claims.values()), \
        "the RUN outputs were saved in the claim files, not journaled"
    journaled = journal.read(box)
    assert set(journaled) == set(claims) and {e.kind for e in journaled.values()} == {RecordKind.RUN_OUTPUT}
    shown = inspect_job(paths, next(iter(claims)))   # `inspect` tells what the journal knows
    assert shown["journaled"] and shown["stage"] == "eval" and "run_slept_s" in shown["outputs"]["run"]
    [path] = [box / name for name in journal.journal_files(os.listdir(box))]
    data = path.read_bytes()
    last = data[: -1].rsplit(b"\n", 1)[-1]
    torn_job = JournalEntry.decode(last).job_id   # type: ignore[union-attr]
    path.write_bytes(data[: len(data) - len(last) // 2])   # the crash tore the last append
    drain_with_a_worker(paths)
    got = {r["job_id"]: r for r in rows(paths)}
    assert len(rows(paths)) == len(got) == submitted.jobs == 4
    runs = per_job(paths, "run_started")
    assert {job: runs[job] for job in got} == {job: 2 if job == torn_job else 1 for job in got}
    assert {r["status"] for r in got.values()} == {"ok"} and {r["attempt"] for r in got.values()} == {2}
    assert all(r["run_s"] and r["run_s"] > 0 for r in got.values())


def stop_two_jobs_when(tmp_path: Path, eval_s: float, eval_pool: int, event: str, count: int,
                       **settings: Any) -> Any:
    """Two sleep jobs through one worker (RUN pool 2), stopped cleanly once `event` was seen
    `count` times; the run's paths."""
    paths = make_run(tmp_path / "run", **settings)
    profile = {"init": 0.01, "run": 0.05, "eval": eval_s}
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 2))
    worker = start_worker(paths, "--run-pool", "2", "--eval-pool", str(eval_pool))
    try:
        wait_until(lambda: len(per_job(paths, event)) == count, 90, f"{count} {event} event(s)")
    finally:
        assert stop_worker(worker) == 0
    return paths


def test_a_clean_stop_during_eval_returns_the_job_to_eval_with_its_run_output(tmp_path: Path) -> None:
    paths = stop_two_jobs_when(tmp_path, 2.0, 2, "eval_started", 2, **{"shutdown.grace_s": 0.2})
    queued = {ticket.name: ticket for ticket in queued_tickets(paths.eval_queue)}
    assert len(queued) == 2 and all("run_slept_s" in t.outputs["run"] for t in queued.values())
    assert not [p for p in paths.active.iterdir()], "claims or a journal left behind"
    drain_with_a_worker(paths)
    assert sorted(Counter(r["job_id"] for r in rows(paths)).values()) == [1, 1]
    assert set(per_job(paths, "run_started").values()) == {1}


def test_a_fenced_worker_with_an_open_journal_harms_nothing(tmp_path: Path) -> None:
    """A worker SIGSTOPped past its lease with its journal open: its claims (and the journal)
    are taken over; resumed, its RUNs end and it may append before it notices (the order of
    its wake-ups is the event loop's); either way every job ends exactly once, none by it."""
    paths = make_run(tmp_path / "run")
    quick = {"handler": "sleep", "instance": {"init": 0.01, "run": 0.01, "eval": 0.01}}
    slow = {"handler": "sleep", "instance": {"init": 0.01, "run": 3.0, "eval": 0.3}}
    submitted = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [quick, slow, slow]))
    paused = start_worker(paths, "--run-pool", "3", "--eval-pool", "3")
    steady = None
    try:
        wait_until(lambda: len(per_job(paths, "run_started")) == 3 and len(per_job(paths, "eval_started")) >= 1,
                   90, "the paused worker to journal and run")
        box = claim_dir_of(paths, paused)
        assert box is not None and journal.journal_files(os.listdir(box)), "a journal is open"
        os.kill(paused.pid, signal.SIGSTOP)
        steady = start_worker(paths)
        wait_until(lambda: not box.exists(), 90, "the paused worker's claims to be taken over")
        ran_at = max(e["t"] for e in events(paths, "run_started") if e["worker"] == box.name)
        time.sleep(max(0.0, ran_at + 3.5 - time.time()))   # its RUNs end the moment it resumes
        os.kill(paused.pid, signal.SIGCONT)
        wait_drained(paths, timeout=120)
        wait_until(lambda: len(events(paths, "lease_lost")) == 1, 60, "the paused worker to notice")
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        codes = [stop_worker(paused)] + ([stop_worker(steady)] if steady else [])
    assert codes == [0] * len(codes)
    got = rows(paths)
    counts = Counter(r["job_id"] for r in got)
    assert len(counts) == submitted.jobs == 3 and max(counts.values()) == 1
    assert not [r for r in got if r["worker"] == box.name and r["run_s"] >= 3.0], \
        "the fenced worker committed a row of a claim it had lost"
    assert not list(paths.active.iterdir()), "nothing (no journal, no reap directory) left behind"


def test_an_append_after_the_claims_were_taken_over_changes_nothing_or_resumes_at_eval(tmp_path: Path) -> None:
    """The two orders a fenced append can take, made deterministic with the real recovery
    code: after the reaper read the journal (the job runs again: the append is lost with the
    journal), or between its rename and its read (the job goes on to EVAL with that output)."""
    from orchestrator.spool.recovery import _reap_worker, _return_claims

    paths = make_run(tmp_path / "run")
    for late_read, job_id in ((False, "after"), (True, "between")):
        worker = f"w-{job_id}"
        box = paths.claims(worker)
        box.mkdir(parents=True)
        (box / job_id).write_bytes(Ticket(spec(job_id), stage=Stage.INIT).encode())
        fenced = Journal.open(box)
        fenced.append(journal_record("other", outputs={"run": {}}))   # the journal is open
        ran = Ticket(spec(job_id), stage=Stage.EVAL, outputs={"init": {}, "run": {"answer": 42}})
        if late_read:
            reap_dir = paths.active / f".reap-{worker}--me"
            assert fsops.rename(box, reap_dir)
            fenced.append(JournalEntry(RecordKind.RUN_OUTPUT, job_id, 1, ran.progress()))
            assert _return_claims(paths, reap_dir, worker, 3, lambda *a: None) == 1
        else:
            assert _reap_worker(paths, worker, "me", 3, lambda *a: None) == 1
            fenced.append(JournalEntry(RecordKind.RUN_OUTPUT, job_id, 1, ran.progress()))  # an unlinked file
            try:
                fenced.rotate({job_id})
                raise AssertionError("a fenced journal must not create files")
            except FileNotFoundError:
                pass
        fenced.close()
        queue = paths.eval_queue if late_read else paths.init_queue
        ticket = Ticket.decode((queue / job_id).read_bytes(), job_id)
        assert ticket.attempt == 2 and ticket.outputs.get("run") == ({"answer": 42} if late_read else None)
        assert [n for n in os.listdir(paths.active)] == [], "the journal went with the claims"
        assert (paths.init_queue / job_id).exists() != (paths.eval_queue / job_id).exists()


def test_the_journal_rotates_and_stays_bounded_over_many_jobs(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(journal, "ROTATE_BYTES", 4096)
    paths = make_run(tmp_path / "run", **{"shards.max_rows": 10})
    profile = {"init": 0.0, "run": 0.02, "eval": 0.002}
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 300))
    seen = {"files": 0, "bytes": 0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for box in list(paths.active.glob("*")):
                try:
                    files = journal.journal_files(os.listdir(box))
                    size = sum((box / f).stat().st_size for f in files)
                except FileNotFoundError:
                    continue
                seen["files"], seen["bytes"] = max(seen["files"], len(files)), max(seen["bytes"], size)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        worker = serve_in_process(paths, timeout=120, run_pool=2, eval_pool=2)
    finally:
        done.set()
        watcher.join()
    assert sorted(Counter(r["job_id"] for r in rows(paths)).values()) == [1] * 300
    appended = worker.state.journal.appended
    assert worker.state.journal.rotations >= 5 and appended > 300 * 300, f"{appended} bytes appended, threshold 4096"
    # at most the old and the new file during a rotation, together a few times the live entries
    assert seen["files"] <= 2 and 0 < seen["bytes"] < min(appended / 3, 64 * 1024), (seen, appended)


def test_a_run_that_ends_while_eval_is_full_waits_here_for_a_slot_not_in_the_eval_queue(tmp_path: Path) -> None:
    """RUN done, every EVAL slot busy: the job waits in this worker's memory (its RUN output
    journaled), not in queue/eval (a ticket write, a claim, a read: docs/scale.md). Killed while it
    waits, it resumes at EVAL elsewhere without running RUN again."""
    paths = make_run(tmp_path / "run", **{"jobs.batch_size": 1})
    profile = {"init": 0.01, "run": 0.05, "eval": 3.0}
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 2))
    seen_in_eval_queue: set[str] = set()
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            seen_in_eval_queue.update(fsops.list_names(paths.eval_queue))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    victim = start_worker(paths, "--run-pool", "2", "--eval-pool", "1")
    try:
        wait_until(lambda: len(per_job(paths, "eval_started")) == 1 and len(per_job(paths, "run_finished")) == 2,
                   90, "one job in EVAL, both RUNs done")
        time.sleep(0.3)   # the second one's hand-off had its chance to show in the queue
        assert seen_in_eval_queue == set(), "a RUN output went through queue/eval while this worker could evaluate it"
        assert len(per_job(paths, "eval_waiting")) == 1
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
    finally:
        watching.set()
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
    drain_with_a_worker(paths)
    got = Counter(r["job_id"] for r in rows(paths))
    assert sorted(got.values()) == [1, 1]
    assert set(per_job(paths, "run_started").values()) == {1}, "RUN ran again"


def test_a_stop_without_grace_gives_jobs_waiting_for_eval_back_to_eval_uncharged(tmp_path: Path) -> None:
    """A stop with no grace period (preemption) must not charge a job waiting here for EVAL an
    attempt: its RUN went well. It goes back to queue/eval with its RUN output, attempt unchanged."""
    paths = stop_two_jobs_when(tmp_path, 30.0, 1, "eval_waiting", 1,
                               **{"jobs.batch_size": 1, "shutdown.grace_s": 0.0})
    waited = next(iter(per_job(paths, "eval_waiting")))
    queued = {ticket.name: ticket for ticket in queued_tickets(paths.eval_queue)}
    assert waited in queued, "the waiting job did not go back to queue/eval"
    assert queued[waited].attempt == 1 and "run_slept_s" in queued[waited].outputs["run"]
    assert per_job(paths, "eval_started")[waited] == 0, "started on top of a full EVAL pool at the stop"


def test_on_a_large_run_a_job_waiting_for_eval_starts_when_a_slot_frees(peers_alive: Any, tmp_path: Path) -> None:
    """On a large run an idle EVAL dispatcher asks the spool only when told there is work: a job
    that starts waiting here must wake it, or it sleeps next to the free slot (up to 30 s)."""
    paths = peers_alive
    worker = start_worker(paths, "--worker-id", ME, "--run-pool", "2", "--eval-pool", "1")
    try:
        wait_until(lambda: (s := summary(paths)) is not None and s.large and ME in s.workers, 60, "a large run")
        time.sleep(2.0)   # the EVAL dispatcher found nothing and sleeps
        profile = {"init": 0.01, "run": 0.05, "eval": 1.0}
        submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 2))
        wait_until(lambda: len(per_job(paths, "eval_waiting")) == 1, 60, "a job waiting for EVAL")
        waited = next(iter(per_job(paths, "eval_waiting")))
        first = next(job for job in per_job(paths, "run_finished") if job != waited)
        wait_until(lambda: per_job(paths, "eval_finished")[first] == 1, 60, "the first EVAL")
        finished_at = next(e["t"] for e in events(paths, "eval_finished") if e["job"] == first)
        wait_until(lambda: per_job(paths, "eval_started")[waited] == 1, 60, "the waiting job's EVAL")
        started_at = next(e["t"] for e in events(paths, "eval_started") if e["job"] == waited)
        assert started_at - finished_at < 10.0, "the waiting job slept next to a free EVAL slot"
    finally:
        stop_worker(worker)


def test_an_unreadable_journal_is_quarantined_and_the_claims_still_return(tmp_path: Path) -> None:
    """A journal that cannot be read (here a directory under its name) must not stop every
    reaper at the same place: it is moved to quarantine, its claims go back as saved."""
    paths = make_run(tmp_path / "run")
    box = paths.claims("w1")
    box.mkdir(parents=True)
    (box / "job1").write_bytes(Ticket(spec("job1"), stage=Stage.INIT).encode())
    (box / ".journal-000001").mkdir()
    assert release_own_claims(paths, "w1", 3, lambda *a: None) == 1
    assert Ticket.decode((paths.init_queue / "job1").read_bytes(), "job1").stage is Stage.INIT
    assert [p.name for p in paths.quarantine.iterdir() if p.name.startswith(".journal-000001")]


"""Lease expiry: claims of a silent worker go back with attempt + 1, end failed past the maximum,
and rows it already committed are not produced again. "Silent" is judged by change, on the
judge's own clock (a FakeClock here): an old mtime alone proves nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orchestrator.spool import fsops
from orchestrator.spool.claims import ClaimBox
from orchestrator.spool.lease import Sightings
from orchestrator.spool.jobs import JobSpec, JobStatus, Stage
from orchestrator.spool.liveness import mark_fenced, write_heartbeat
from orchestrator.spool.recovery import reap_expired
from orchestrator.spool.rows import build_row
from orchestrator.config import Shards
from orchestrator.spool.shards import ShardWriter
from orchestrator.spool.tickets import Ticket
from tests.core.util import make_run


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def judged_after(lease_s: float) -> tuple[Sightings, FakeClock]:
    clock = FakeClock()
    return Sightings(clock=clock), clock


def ticket(name: str, stage: Stage, attempt: int = 1) -> Ticket:
    job = JobSpec(job_id=name, group_id=name, instance_id=name, sample_index=0, handler="echo", instance={})
    return Ticket(job=job, stage=stage, attempt=attempt, state={"sandbox": {"pid": 1}})


def test_expired_claims_return_to_their_queues(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    dead = "node9-1-dead"
    write_heartbeat(paths, dead, {"node": "node9"})
    old = time.time() - 60
    os.utime(paths.heartbeat(dead), (old, old))   # as a node whose clock runs slow would stamp it
    box = ClaimBox(paths, dead)
    last = ticket("d-last", Stage.RUN, attempt=4)  # three workers died on it already, none came back
    last.history = [{"lost": "worker w lost (lease expired)", "lease_of": f"gone-{i}", "attempt": i} for i in (1, 2, 3)]
    for t in (ticket("a-init", Stage.INIT), ticket("b-run", Stage.RUN), ticket("c-eval", Stage.EVAL),
              last, ticket("e-done", Stage.EVAL)):
        box.save(t)
    # e-done's row was committed by the dead worker just before it died
    writer = ShardWriter(paths, dead, Shards())
    writer.add(build_row(ticket("e-done", Stage.EVAL), {}, JobStatus.OK, dead), "e-done")
    writer.commit()
    (paths.claims(dead) / "corrupt").write_bytes(b"{not json")

    events: list[tuple[str, str]] = []
    judge, clock = judged_after(2.0)
    emit = lambda j, e, f: events.append((j, e))  # noqa: E731
    assert reap_expired(paths, "me-1-live", 2.0, 3, emit, sightings=judge) == 0, "an old mtime is no proof of death"
    clock.now += 2.0                               # unchanged for a lease as this judge saw it
    moved = reap_expired(paths, "me-1-live", lease_s=2.0, max_attempts=3, emit=emit, sightings=judge)
    assert moved == 4
    init = {n: Ticket.decode((paths.init_queue / n).read_bytes()) for n in fsops.list_names(paths.init_queue)}
    evalq = {n: Ticket.decode((paths.eval_queue / n).read_bytes()) for n in fsops.list_names(paths.eval_queue)}
    assert sorted(init) == ["a-init", "b-run"] and sorted(evalq) == ["c-eval", "d-last"]
    assert init["b-run"].attempt == 2 and "sandbox" not in init["b-run"].state  # its sandbox died too
    assert evalq["c-eval"].attempt == 2 and evalq["c-eval"].status is None
    assert evalq["d-last"].status is JobStatus.FAILED and evalq["d-last"].error["kind"] == "attempts_exhausted"
    assert not paths.claims(dead).exists() and (paths.workers / "gone" / f"{dead}.json").exists()
    assert len(list(paths.quarantine.glob("corrupt.*.reason"))) == 1   # kept aside, not deleted
    assert ("a-init", "requeued") in events
    # a second pass finds nothing more to do
    assert reap_expired(paths, "me-1-live", 2.0, 3, lambda *a: None, sightings=judge) == 0


def test_live_workers_are_left_alone_whatever_their_clock(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    write_heartbeat(paths, "busy-1-abcd", {"node": "n1"})
    ClaimBox(paths, "busy-1-abcd").save(ticket("x", Stage.RUN))
    judge, clock = judged_after(30.0)
    for beat in range(5):   # it beats every 10 s of the judge's time, stamping files 10 minutes in the past
        assert reap_expired(paths, "me", 30.0, 3, lambda *a: None, sightings=judge) == 0
        write_heartbeat(paths, "busy-1-abcd", {"node": "n1"})
        old = time.time() - 600 + beat
        os.utime(paths.heartbeat("busy-1-abcd"), (old, old))
        clock.now += 10.0
    assert reap_expired(paths, "me", 30.0, 3, lambda *a: None, sightings=judge) == 0
    assert (paths.claims("busy-1-abcd") / "x").exists()


def test_attempts_lost_with_a_lease_are_charged_only_once_their_worker_is_known_dead(tmp_path: Path) -> None:
    """Issue 22 item 3: an attempt lost to fencing is not charged to the job. A lease loss is
    charged once its worker never came back; not the one being counted (it may yet come back),
    never one whose worker came back fenced (workers/fenced/W)."""
    paths = make_run(tmp_path / "run")
    dead = "node9-1-dead"
    write_heartbeat(paths, dead, {"node": "node9"})
    # the same story twice, but f-fenced's first worker came back fenced, g-killer's never did
    paused_back, died = ticket("f-fenced", Stage.RUN, attempt=3), ticket("g-killer", Stage.RUN, attempt=3)
    paused_back.history = [{"lost": "lease expired", "lease_of": "paused-1-beef", "attempt": 1},
                           {"lost": "lease expired", "lease_of": "killed-1-beef", "attempt": 2}]
    died.history = [{"lost": "lease expired", "lease_of": "killed-0-beef", "attempt": 1},
                    {"lost": "lease expired", "lease_of": "killed-1-beef", "attempt": 2}]
    for t in (paused_back, died):
        ClaimBox(paths, dead).save(t)
    mark_fenced(paths, "paused-1-beef")           # it came back and found its claims gone
    judge, clock = judged_after(2.0)
    reap_expired(paths, "me-1-live", 2.0, 2, lambda *a: None, sightings=judge)
    clock.now += 2.0
    assert reap_expired(paths, "me-1-live", 2.0, 2, lambda *a: None, sightings=judge) == 2
    init = {n: Ticket.decode((paths.init_queue / n).read_bytes()) for n in fsops.list_names(paths.init_queue)}
    evalq = {n: Ticket.decode((paths.eval_queue / n).read_bytes()) for n in fsops.list_names(paths.eval_queue)}
    assert init["f-fenced"].attempt == 4 and init["f-fenced"].status is None   # 2 charged of 4: runs again
    assert evalq["g-killer"].status is JobStatus.FAILED                        # 3 charged, max 2: given up
    assert "gave up after 2 attempts" in evalq["g-killer"].error["message"]
    assert init["f-fenced"].history[-1]["lease_of"] == dead


def test_prepared_jobs_of_a_dead_node_go_back_to_init(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    queue = paths.run_queue("lostnode")
    queue.mkdir(parents=True)
    (queue / "p1").write_bytes(ticket("p1", Stage.RUN).encode())
    judge, clock = judged_after(2.0)
    assert reap_expired(paths, "me", 2.0, 3, lambda *a: None, sightings=judge) == 0   # a worker may be starting there
    clock.now += 2.0
    assert reap_expired(paths, "me", 2.0, 3, lambda *a: None, sightings=judge) == 1
    assert Ticket.decode((paths.init_queue / "p1").read_bytes()).attempt == 2


class Killed(BaseException):
    """A SIGKILL at this point: nothing after it runs (not an Exception, so nothing catches it)."""


@pytest.mark.parametrize("in_batch", [False, True])
def test_a_requeue_killed_half_way_leaves_the_job_queued_exactly_once(tmp_path: Path, monkeypatch, in_batch: bool) -> None:
    """requeue_claim moves the claimed ticket to its queue with attempt + 1. A kill between its
    steps must leave one copy of the job: in the queue, or in the claim directory (recovery then
    returns it), never both (a worker claiming the queued copy while recovery requeues the
    claimed one ends the job twice). A job of a held batch first leaves it by the hand-off
    protocol (its own ticket written, the hand-off recorded), as the engine does."""
    from orchestrator.spool.batches import batch_name, encode_batch
    from orchestrator.spool.recovery import release_own_claims, requeue_claim
    from orchestrator.worker.held_batches import BatchClaims

    paths = make_run(tmp_path / "run")
    box = ClaimBox(paths, "w1")
    first, second = ticket("job1", Stage.INIT), ticket("job2", Stage.INIT)
    if in_batch:
        batch = batch_name("job1", 2)
        (box.dir / batch).write_bytes(encode_batch([first, second]))
        claims = BatchClaims(box, ShardWriter(paths, "w1", Shards()))
        claims.take(batch)
        claims.leave_by_requeue(first)
        claims.close(stopped_cleanly=False)
    else:
        (box.dir / "job1").write_bytes(first.encode())
    real = {name: getattr(fsops, name) for name in ("replace", "sync_dir", "unlink", "rename")}

    def killed_at_the_first_step_after_the_new_content_is_written(name: str):
        def step(*args, **kwargs):
            raise Killed(f"killed at fsops.{name}{args}")
        return step

    for name in real:
        monkeypatch.setattr(fsops, name, killed_at_the_first_step_after_the_new_content_is_written(name))
    try:
        requeue_claim(paths, box.dir / "job1", "worker error in init", 3, lambda *a: None)
    except Killed:
        pass
    for name, function in real.items():
        monkeypatch.setattr(fsops, name, function)
    other = ClaimBox(paths, "w2")
    claimed_by_other = other.claimer(paths.init_queue).claim()   # a live worker takes what was queued
    release_own_claims(paths, "w1", 3, lambda *a: None)   # then w1's claims are returned
    copies = sorted(os.listdir(paths.init_queue) + other.names())
    assert copies == (["job1", "job2"] if in_batch else ["job1"]), f"each job must be in one place, found {copies}"
    assert not box.dir.exists()
    holder = other.dir if claimed_by_other == "job1" else paths.init_queue
    queued = Ticket.decode((holder / "job1").read_bytes(), "job1")
    assert queued.attempt in (2, 3)   # the lost attempt counted (twice if the kill came after the rewrite)

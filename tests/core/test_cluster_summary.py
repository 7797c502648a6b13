"""On a large run a worker learns what concerns everyone from the cluster summary, not by polling.

A real worker process among simulated live workers (heartbeats kept fresh by the test, more
than the 16 of orchestrator/spool/cluster_summary.py LARGE_RUN_WORKERS) rebuilds `control/cluster.json` and
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

from orchestrator.spool.claims import ClaimBox
from orchestrator.spool import fsops
from orchestrator.spool.cluster_summary import (LARGE_RUN_WORKERS, CarriedJudge, ClusterView, Rebuild, Summary,
                                                WorkerSummary, build_summary)
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.lease import Sightings, break_if_stale, try_lock
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.recovery import reap_found
from orchestrator.submission.submit import submit_file
from orchestrator.spool.tickets import Ticket
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
    """A worker that died holding one claim: its heartbeat never changes again (its mtime, old or
    not, proves nothing: whoever judges it must see it stay the same for a lease)."""
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
        assert worker.wait(timeout=60) == 0   # seen through the summary's stop_key
        assert duty_ops(paths, "stop_poll") == {"stop_poll": before["stop_poll"]}
    finally:
        stop_worker(worker)


# --- the rebuild itself, called directly (no worker process): damaged input, skewed clocks ---

LEASE_S = LARGE["leases.lease_s"]


def no_events(*args: object, **kwargs: object) -> None:
    return None


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def view_with_clock(paths: SpoolPaths) -> tuple[ClusterView, FakeClock]:
    """A process's view of the summary whose own (monotonic) clock the test moves."""
    clock = FakeClock()
    return ClusterView(paths, LEASE_S, 0.5, clock=clock, sightings=Sightings(clock=clock)), clock


def large_summary_dated(built_at: float, generation: int = 7) -> bytes:
    """A summary of a large run (PEERS live workers) stamped `built_at`."""
    workers = {f"peer{i:02d}-1-beef": WorkerSummary(True, f"peer{i:02d}", {}, {}, False) for i in range(PEERS)}
    return orjson.dumps(Summary(built_at=built_at, workers=workers, generation=generation, builder="b").to_json())


def test_a_malformed_heartbeat_neither_stops_the_rebuild_nor_drops_its_worker(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **LARGE)
    beats = {
        "good-1-beef": {"node": "n1", "load": {"inflight": {"http://a": 2}, "assigned": {"http://a": 5}}},
        "strings-1-beef": {"node": "n2", "load": {"inflight": {"http://a": "two"}}},   # ValueError
        "list-1-beef": {"node": "n3", "load": {"inflight": [1, 2]}},                  # AttributeError
        "none-1-beef": {"node": "n4", "load": {"assigned": {"http://a": None}}},      # TypeError
        "pools-1-beef": {"node": "n5", "pools": {"run": {"size": "big"}, "init": {"size": 1}}},
    }
    for worker, info in beats.items():
        paths.heartbeat(worker).write_bytes(orjson.dumps(info))

    rebuilt = ClusterView(paths, LEASE_S, 0.5).refresh()

    assert rebuilt is not None and set(rebuilt.summary.workers) == set(beats)
    workers = rebuilt.summary.workers
    assert (workers["good-1-beef"].inflight, workers["good-1-beef"].assigned) == ({"http://a": 2}, {"http://a": 5})
    assert all(workers[w].inflight == {} and workers[w].alive for w in beats if w != "good-1-beef")
    assert summary(paths) is not None   # written for the others


def test_a_damaged_summary_is_treated_as_absent_and_rebuilt(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **LARGE)
    damaged = orjson.loads(large_summary_dated(time.time()))
    damaged["stop_key"] = "soon"
    paths.cluster_summary.write_bytes(orjson.dumps(damaged))
    view = ClusterView(paths, LEASE_S, 0.5)

    assert view.refresh() is not None   # rebuilt, not taken as it is
    assert view.summary is not None and view.summary.stop_key is None


@pytest.mark.parametrize("skew_s", [120, -120])
def test_a_summary_is_judged_by_whether_it_changes_never_by_its_date(tmp_path: Path, skew_s: float) -> None:
    """A rebuilder whose clock ran 2 minutes off died: its summary is fresh while it changes, due for
    a rebuild once it stayed the same for a rebuild period, and stale after a lease, whatever its date."""
    paths = make_run(tmp_path / "run", **LARGE)
    paths.cluster_summary.write_bytes(large_summary_dated(time.time() + skew_s))
    view, clock = view_with_clock(paths)

    assert view.refresh() is None and view.fresh() is not None   # just seen: fresh, not due
    clock.now += LEASE_S - 0.1
    assert view.fresh() is not None                               # whatever its date says
    clock.now += 0.1                                              # the same for a lease: its rebuilders died
    assert view.fresh() is None
    rebuilt = view.refresh()                                      # long due: this process rebuilds it
    assert rebuilt is not None and rebuilt.summary.generation == 8


def test_a_listed_heartbeat_that_cannot_be_read_keeps_its_claims(tmp_path: Path) -> None:
    """A live worker's heartbeat replaced mid-read (here: one whose open fails) is no proof it is gone:
    its claim directory, unchanged for longer than a lease on a long RUN, stays where it is."""
    paths = make_run(tmp_path / "run", **LARGE)
    live = "live00-1-beef"
    job = JobSpec(job_id="long-0000001-0000", group_id="long", instance_id="long", sample_index=0,
                  handler="echo", instance={})
    ClaimBox(paths, live).save(Ticket(job=job, stage=Stage.RUN))
    clock = FakeClock()
    judge = CarriedJudge(paths.root, Sightings(clock=clock), {}, 0.0)
    judge.unchanged_for(str(paths.claims(live)), fsops.identity(paths.claims(live)))
    clock.now += 10 * LEASE_S   # the claim directory stayed the same for 10 leases as this judge saw it
    paths.heartbeat(live).mkdir()   # listed, but its open fails (as a replaced file's may: ESTALE)

    rebuilt = build_summary(paths, LEASE_S, judge)
    assert rebuilt.sweep and live not in rebuilt.summary.workers
    reap_found(paths, ME, LEASE_S, 3, no_events, rebuilt)

    assert [p.name for p in paths.claims(live).iterdir()] == [Ticket(job=job, stage=Stage.RUN).name]


def test_the_summary_written_by_a_rebuild_that_requeued_claims_says_the_queue_holds_them(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **LARGE)
    dead_worker_with_a_claim(paths, "orphan-0000001-0000")
    view, clock = view_with_clock(paths)
    recover = lambda found: reap_found(paths, ME, LEASE_S, 3, no_events, found)  # noqa: E731

    first = view.refresh(recover=recover)
    assert first is not None and first.moved == 0 and first.summary.workers["dead00-1-beef"].alive   # first sight
    clock.now += LEASE_S   # its heartbeat stayed the same for a lease as this process saw it
    rebuilt = view.refresh(recover=recover)

    assert rebuilt is not None and rebuilt.moved == 1
    assert fsops.has_entries(paths.init_queue)
    written = summary(paths)
    assert written is not None and written.queued[paths.init_queue.name]


def test_a_rebuilder_lock_is_broken_well_before_readers_give_up_on_the_summary(tmp_path: Path) -> None:
    """A rebuilder died holding the lock: the lock goes after a few rebuild periods (under half a
    lease), so the next rebuild comes before readers find the summary older than a lease."""
    paths = make_run(tmp_path / "run", **LARGE)
    view, clock = view_with_clock(paths)
    assert try_lock(view.lock_file, "a-rebuilder-that-died") is not None   # and never released
    assert view.stale_lock_s() <= 0.4 * LEASE_S

    assert view.refresh() is None   # held: seen for the first time
    clock.now += view.stale_lock_s()
    assert view.refresh() is None and not view.lock_file.exists()   # unchanged that long: broken
    clock.now += view.read_period()
    assert view.refresh() is not None


def test_a_paused_rebuilder_never_removes_the_lock_another_took_meanwhile(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **LARGE)
    paused, other = ClusterView(paths, LEASE_S, 0.5), ClusterView(paths, LEASE_S, 0.5)

    taken = []

    def paused_past_stale(found: Rebuild) -> int:
        """While `paused` rebuilds, its lock is broken as stale and `other` takes it (and is still on it)."""
        clock = FakeClock()
        judge = Sightings(clock=clock)
        assert not break_if_stale(other.lock_file, 1.0, judge)
        clock.now += 1.0                                                   # unchanged as the other saw it
        assert break_if_stale(other.lock_file, 1.0, judge) and not paused.lock_file.exists()   # broken
        taken.append(try_lock(other.lock_file, "other-rebuilder"))       # taken (its rebuild under way)
        return 0

    assert paused.refresh(recover=paused_past_stale) is not None
    assert taken[0] is not None and taken[0].held(), "the paused rebuilder removed the other's lock"

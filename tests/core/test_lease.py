"""The one lock/lease algorithm of spool/lease.py: a test per guarantee.

- mutual exclusion under contention, across processes;
- a stale lock (its holder SIGKILLed) is broken, after `stale_s` as the contender saw it;
- a paused holder (SIGSTOP) cannot release, nor renew, the lock another process took meanwhile,
  even when it is paused between the two steps of its release;
- staleness is judged by change, on the judge's own clock: an old mtime is no proof of death,
  and a holder that keeps renewing is never broken.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from orchestrator.spool import fsops, lease
from orchestrator.spool.fs_record import required_lease_s
from orchestrator.spool.lease import LockTimeout, Sightings, acquire, break_if_stale, try_lock

CONTENDERS = 6
ROUNDS = 25


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def count_under_lock(lock_path: str, counter: str, inside: str, rounds: int, start: "multiprocessing.synchronize.Barrier") -> None:
    start.wait()
    for _ in range(rounds):
        held = acquire(Path(lock_path), timeout_s=60, stale_s=30)
        try:
            # Nobody else may be inside: this exclusive create fails if they are.
            if not fsops.create_exclusive(Path(inside)):
                os._exit(17)
            value = int(Path(counter).read_text() or 0)   # a read-modify-write the lock must protect
            time.sleep(0.001)
            Path(counter).write_text(str(value + 1))
            os.unlink(inside)
        finally:
            held.release()


def test_contending_processes_are_mutually_excluded(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    counter = tmp_path / "counter"
    counter.write_text("0")
    start = context.Barrier(CONTENDERS)
    args = (str(tmp_path / "the.lock"), str(counter), str(tmp_path / "inside"), ROUNDS, start)
    workers = [context.Process(target=count_under_lock, args=args) for _ in range(CONTENDERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0] * CONTENDERS, "two holders were inside at once (exit 17)"
    assert counter.read_text() == str(CONTENDERS * ROUNDS), "an update under the lock was lost"
    assert not (tmp_path / "the.lock").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".the.lock")], "a private directory was left"


def hold_forever(lock_path: str, ready: "multiprocessing.synchronize.Event") -> None:
    acquire(Path(lock_path), timeout_s=10, stale_s=30)
    ready.set()
    time.sleep(600)


def test_a_lock_whose_holder_was_killed_is_broken_after_stale_s(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(target=hold_forever, args=(str(tmp_path / "the.lock"), ready))
    holder.start()
    assert ready.wait(30)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    with pytest.raises(LockTimeout):   # still held (nobody can tell it is dead yet): no wait breaks it early
        acquire(tmp_path / "the.lock", timeout_s=0.3, stale_s=1.0, sightings=Sightings())
    started = time.monotonic()
    taken = acquire(tmp_path / "the.lock", timeout_s=10, stale_s=1.0, sightings=Sightings())
    waited = time.monotonic() - started
    assert 1.0 <= waited < 5, f"broken after {waited:.2f}s, stale_s 1.0"
    assert taken.held()
    taken.release()


def hold_then_release(lock_path: str, ready: "multiprocessing.synchronize.Event", go: str, done: str) -> None:
    held = acquire(Path(lock_path), timeout_s=10, stale_s=30)
    ready.set()
    while not os.path.exists(go):
        time.sleep(0.01)
    renewed = held.renew()   # it learns it lost the lock ...
    held.release()           # ... and its release must not remove the new holder's
    Path(done).write_text(f"renewed={renewed}")


def test_a_paused_holder_cannot_release_or_renew_the_lock_another_took(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    lock_path, go, done = tmp_path / "the.lock", tmp_path / "go", tmp_path / "done"
    ready = context.Event()
    paused = context.Process(target=hold_then_release, args=(str(lock_path), ready, str(go), str(done)))
    paused.start()
    try:
        assert ready.wait(30)
        os.kill(paused.pid, signal.SIGSTOP)            # paused past the lock's staleness
        taken = acquire(lock_path, timeout_s=10, stale_s=0.5, sightings=Sightings())
        go.write_text("")
        os.kill(paused.pid, signal.SIGCONT)
        paused.join(30)
        assert paused.exitcode == 0 and done.read_text() == "renewed=False"
        assert taken.held(), "the paused holder removed the lock another process took"
        assert try_lock(lock_path) is None
        assert taken.renew() and taken.held()
        taken.release()
        assert not lock_path.exists()
    finally:
        if paused.is_alive():
            os.kill(paused.pid, signal.SIGCONT)
            paused.join(5)


def test_a_release_cut_between_its_two_steps_cannot_remove_the_next_holders_lock(tmp_path: Path) -> None:
    lock_path = tmp_path / "the.lock"
    first = try_lock(lock_path)
    assert first is not None
    fsops.unlink(first.token)            # the first step of its release, then a pause
    second = try_lock(lock_path)         # the empty directory is taken over at once
    assert second is not None and second.held()
    first.release()                      # resumed: its rmdir meets the second holder's token
    assert second.held() and try_lock(lock_path) is None
    second.release()
    assert not lock_path.exists()


def test_an_old_mtime_is_no_proof_of_death_and_a_renewing_holder_is_never_broken(tmp_path: Path) -> None:
    lock_path = tmp_path / "the.lock"
    held = try_lock(lock_path)
    assert held is not None
    old = time.time() - 3600                     # as a holder on a node whose clock runs slow would stamp it
    os.utime(held.token, (old, old))
    os.utime(lock_path, (old, old))
    clock = FakeClock()
    judge = Sightings(clock=clock)
    assert not break_if_stale(lock_path, 5.0, judge)   # first sight: nothing is known yet
    for _ in range(4):
        clock.now += 3.0                          # 12 s of the judge's time in all, stale_s 5
        assert held.renew()
        assert not break_if_stale(lock_path, 5.0, judge)
    assert held.held()
    clock.now += 5.0                              # now silent for 5 s as the judge saw it
    assert break_if_stale(lock_path, 5.0, judge)
    assert not held.held() and not held.renew() and not lock_path.exists()


def test_a_lock_file_of_the_older_format_is_broken_when_it_stays_unchanged(tmp_path: Path) -> None:
    lock_path = tmp_path / "backends.json.lock"
    lock_path.write_text("left by a writer that crashed")
    clock = FakeClock()
    judge = Sightings(clock=clock)
    assert not break_if_stale(lock_path, 5.0, judge) and lock_path.exists()
    clock.now += 5.0
    assert break_if_stale(lock_path, 5.0, judge) and not lock_path.exists()
    assert try_lock(lock_path) is not None


def test_sightings_judge_by_change_on_their_own_clock() -> None:
    clock = FakeClock()
    seen = Sightings(clock=clock, limit=3)
    assert seen.unchanged_for("w1", (1, 100)) == 0.0
    clock.now += 4
    assert seen.unchanged_for("w1", (1, 100)) == 4.0
    assert seen.unchanged_for("w1", (2, 200)) == 0.0      # it changed: alive, the count starts again
    clock.now += 1
    assert not seen.silent("w1", (2, 200), 2.0)
    for key in ("a", "b", "c"):                            # bounded: the oldest sighting goes first
        seen.unchanged_for(key, 0)
    assert seen.unchanged_for("w1", (2, 200)) == 0.0


def test_the_lock_module_is_the_only_place_that_breaks_stale_locks() -> None:
    """softlock.py and leasefile.py are gone, and no module judges staleness by comparing this
    node's clock with a file's mtime (sandbox/sweep.py looks at node-local /tmp only: one clock)."""
    root = Path(lease.__file__).parents[1]
    assert not (root / "spool" / "softlock.py").exists() and not (root / "spool" / "leasefile.py").exists()
    offenders = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py") if p.name != "sweep.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if "time.time()" in line and "mtime" in line]
    assert not offenders, offenders



@pytest.mark.parametrize(("heartbeat_s", "delay_s"), [(1.0, 2.011), (1.0, 2.0), (0.5, 0.04), (10.0, 0.449)])
def test_the_lease_doctor_recommends_is_never_rounded_below_twice_beat_plus_delay(heartbeat_s: float,
                                                                                 delay_s: float) -> None:
    needed = required_lease_s(heartbeat_s, delay_s)
    assert needed >= 2 * (heartbeat_s + delay_s) and needed - 2 * (heartbeat_s + delay_s) < 0.1 + 1e-9
    assert round(needed * 10) == needed * 10   # a tenth of a second: what `--set leases.lease_s=` is told

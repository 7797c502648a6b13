"""The decision behind `adapt` (pure counts) and the lease that keeps two controllers from fighting."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchestrator.spool.lease import Lease, Sightings
from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.scaling import Action, Bounds, Observation, decide
from orchestrator.slurm.adapt import AdaptError, AdaptSettings, Controller, kind_of, state_path
from orchestrator.slurm.options import LaunchOptions
from orchestrator.submission.submit import submit_file
from orchestrator.worker.options import WorkerOptions, parse_stages
from tests.core.util import make_run, write_jsonl

BOUNDS = Bounds(minimum=0, maximum=4, slots_per_worker=8, cooldown_s=30.0)


def seen(backlog: int = 0, running: int = 0, pending: int = 0, kept: int = 0) -> Observation:
    return Observation(backlog=backlog, running=running, pending=pending, kept=kept)


def test_a_backlog_grows_workers_up_to_the_maximum_counting_pending_ones() -> None:
    assert decide(BOUNDS, seen(backlog=20), None).action is Action.GROW
    assert decide(BOUNDS, seen(backlog=20), None).count == 3            # ceil(20 / 8)
    assert decide(BOUNDS, seen(backlog=100), None).count == 4           # capped by --max
    assert decide(BOUNDS, seen(backlog=100, running=2, pending=2), None).action is Action.HOLD
    assert decide(BOUNDS, seen(backlog=20, pending=3), None).action is Action.HOLD   # already asked for
    grow = decide(BOUNDS, seen(backlog=100, running=1, pending=1), 60.0)
    assert (grow.action, grow.count, grow.target) == (Action.GROW, 2, 4)


def test_no_backlog_withdraws_pending_tasks_and_never_stops_running_workers() -> None:
    withdraw = decide(BOUNDS, seen(backlog=0, running=2, pending=2), 60.0)
    assert (withdraw.action, withdraw.count, withdraw.target) == (Action.WITHDRAW, 2, 2)
    steady = decide(BOUNDS, seen(backlog=0, running=3), 60.0)
    assert steady.action is Action.HOLD and steady.target == 3
    lowered = decide(Bounds(0, 2, 8, 30.0), seen(backlog=0, running=3), 60.0)   # a controller restarted with a lower --max
    assert lowered.action is Action.HOLD and lowered.target == 2 and "leave when idle" in lowered.reason


def test_cool_down_holds_changes_but_not_the_minimum() -> None:
    assert decide(BOUNDS, seen(backlog=20), 5.0).action is Action.HOLD
    assert decide(BOUNDS, seen(running=1, pending=2), 5.0).action is Action.HOLD
    keep = Bounds(minimum=2, maximum=4, slots_per_worker=8, cooldown_s=30.0)
    first = decide(keep, seen(), 5.0)
    assert (first.action, first.count, first.keep) == (Action.GROW, 2, True)
    assert decide(keep, seen(running=2, kept=2), 60.0).action is Action.HOLD


def test_impossible_bounds_are_refused_with_the_rule() -> None:
    with pytest.raises(ValueError, match="--min"):
        Bounds(minimum=5, maximum=2, slots_per_worker=8, cooldown_s=0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_holder_at_a_time_and_a_stale_lease_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "adapt-all.lease"
    clock = FakeClock()   # the second contender's own clock: it judges the first by what it saw change
    first, second = Lease(path, "a", stale_s=5.0), Lease(path, "b", stale_s=5.0, sightings=Sightings(clock=clock))
    assert first.acquire()
    assert not second.acquire()
    clock.now += 6
    assert first.renew() and first.acquire()
    assert not second.acquire(), "a holder that renews is never taken over"
    clock.now += 6                             # the first holder went silent for the whole lease
    assert second.acquire() and second.held()
    assert not first.renew() and not first.acquire()   # it notices it lost the lease
    assert second.current_holder() == "b"
    second.release()
    assert not path.exists() and first.acquire()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def controller(paths: SpoolPaths, stages: str, clock: Any = time.monotonic) -> Controller:
    settings = AdaptSettings(Bounds(0, 4, 8, 30.0), idle_exit_s=60, interval_s=1, lease_stale_s=5)
    return Controller(paths.root, settings, LaunchOptions(nodes=1), WorkerOptions(stages=parse_stages(stages)), clock)


def test_each_kind_of_worker_counts_its_own_queues_and_one_controller_acts(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}] * 10))
    for index in range(3):
        (paths.eval_queue / f"evaluate-me-{index}").write_text("{}")
    full, evaluators = controller(paths, "all"), controller(paths, "eval")
    assert full.observe()[0].backlog == 13 and evaluators.observe()[0].backlog == 3
    with pytest.raises(AdaptError, match="all or eval"):
        kind_of(parse_stages("init,run"))

    # One controller of a kind acts, another stands by (its tick does nothing); the eval
    # controller has a lease of its own.
    clock = FakeClock()
    other = controller(paths, "all", clock)
    assert full.lease.acquire() and not other.lease.acquire()
    assert other.tick() is None
    assert evaluators.lease.acquire()
    assert full.observe()[0].backlog == 10, "with an eval controller alive, the eval queue is its business"
    grown_at = time.time() - 3
    state_path(paths, "all").write_bytes(orjson.dumps({"holder": "gone-1", "decisions": [{"action": "grow", "t": grown_at}]}))
    clock.now += 6                             # the acting controller went silent (as the other saw it)
    assert other.lease.acquire()
    other._resume_history()
    assert [d["action"] for d in other.decisions] == ["grow", "lead"]
    assert "took over from gone-1" in other.decisions[-1]["reason"]
    assert other.last_change_at is not None and 2.5 < other.clock() - other.last_change_at < 60, "the cool-down carries over"


def test_a_controller_whose_squeue_fails_holds_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = make_run(tmp_path / "run")
    record = paths.logs / "adapt-all-idle-20261122T000000-1-1" / "slurm.json"
    record.parent.mkdir(parents=True)
    record.write_bytes(orjson.dumps({"arrays": [{"job_id": "4242", "first_index": 0, "size": 2}]}))
    monkeypatch.setenv("PATH", str(tmp_path))          # no squeue, no sbatch: nothing can be launched either
    acting = controller(paths, "all")
    assert acting.tick() is None
    state = orjson.loads(state_path(paths, "all").read_bytes())
    assert "squeue did not answer" in state["decisions"][-1]["error"]
    assert acting.lease.held()

"""Metadata operations per decision stay flat as the run grows (counted, never timed).

Each test builds the same situation at two sizes (workers W, shards S) with real files and
compares the operations the engine counts in orchestrator.spool.fsops.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from orchestrator.spool import fsops
from orchestrator.spool.claims import ClaimBox
from orchestrator.config import ConfigError, RunConfig, Shards
from orchestrator.spool.jobs import JobSpec, JobStatus, Stage
from orchestrator.spool.lease import Sightings
from orchestrator.spool.liveness import write_heartbeat
from orchestrator.spool.recovery import reap_expired
from orchestrator.spool.rows import build_row
from orchestrator.spool.shards import ShardWriter
from orchestrator.spool.tickets import Ticket
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import Router
from orchestrator.spool.paths import SpoolPaths
from tests.core.util import make_run


def ops_of(call, *args, **kwargs) -> tuple[int, object]:
    before = sum(fsops.OPS.values())
    result = call(*args, **kwargs)
    return sum(fsops.OPS.values()) - before, result


def simulated_workers(paths: SpoolPaths, workers: int, urls: list[str]) -> None:
    """W workers with a live heartbeat and an in-flight board each, as a worker writes them: small
    runs route on the boards, large ones on the counts the heartbeats carry to the cluster summary."""
    for w in range(workers):
        worker = f"sim{w:04d}"
        load = {"inflight": {urls[w % len(urls)]: 1}, "assigned": {urls[w % len(urls)]: 3}}
        paths.heartbeat(worker).write_bytes(orjson.dumps({"node": f"n{w}", "load": load}))
        (paths.backends_inflight / f"{worker}.json").write_bytes(orjson.dumps({"worker": worker, "node": f"n{w}", **load}))


def pick_ops(tmp_path: Path, workers: int, picks: int = 20) -> tuple[float, dict[str, int]]:
    paths = make_run(tmp_path / f"w{workers}")
    urls = [f"http://b{i}:8000/v1" for i in range(4)]
    for url in urls:
        BackendRegistry(paths).add(url)
    simulated_workers(paths, workers, urls)
    router = Router(paths, "me", node="n-me")
    router.choose(router.registry.read())   # the first decision of a process may read everything once
    total = 0
    for _ in range(picks):
        spent, _ = ops_of(lambda: router.choose(router.registry.read()))
        total += spent
    return total / picks, router.view.load(router.board).inflight


def test_routing_decision_cost_is_flat_in_workers(tmp_path: Path) -> None:
    small, small_load = pick_ops(tmp_path, 10)
    large, large_load = pick_ops(tmp_path, 400)
    # the large run's view still counts every worker's tasks in flight
    assert sum(large_load.values()) == 400 and sum(small_load.values()) == 10
    assert large <= 1.5 * small, (small, large)


def test_small_runs_route_on_exact_counts(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    urls = ["http://a:1/v1", "http://b:1/v1"]
    for url in urls:
        BackendRegistry(paths).add(url)
    w1, w2 = Router(paths, "w1", node="x"), Router(paths, "w2", node="y")
    picks = Counter()
    for router in (w1, w2, w1, w2):
        backend = router.choose(router.registry.read())
        router.board.change(backend.url, +1)
        picks[backend.url] += 1
    assert picks == Counter({urls[0]: 2, urls[1]: 2})   # each saw the other's task at once


def dead_worker_with_shards(root: Path, shards: int) -> tuple[SpoolPaths, str]:
    """A worker that committed `shards` shards (one row each), then died between committing the
    last one and dropping its ticket; two more tickets were still claimed. Its heartbeat is old."""
    paths = make_run(root)
    dead = "node9-1-dead"
    box = ClaimBox(paths, dead)
    writer = ShardWriter(paths, dead, Shards())
    for index in range(shards):
        name = f"job-{index:06d}"
        box.save(ticket(name))
        writer.add(build_row(ticket(name), {}, JobStatus.OK, dead), name)
        writer.write(writer.take(), staging=box.dir)
        if index < shards - 1:
            box.drop(name)
            writer.dropped_through = writer.last_seq
    for name in ("job-late-1", "job-late-2"):
        box.save(ticket(name))
    write_heartbeat(paths, dead, {"node": "node9", "shards": writer.progress()})
    return paths, dead


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def judge_that_saw(paths: SpoolPaths, me: str, lease_s: float) -> Sightings:
    """A judge (its own clock) that has watched the run for a whole lease: the silent are dead to it."""
    clock = FakeClock()
    judge = Sightings(clock=clock)
    reap_expired(paths, me, lease_s, 3, lambda *a: None, random.Random(1), sightings=judge)
    clock.now += lease_s
    return judge


def test_restart_recovery_cost_is_flat_in_shards(tmp_path: Path) -> None:
    costs = {}
    for shards in (3, 30):
        paths, _ = dead_worker_with_shards(tmp_path / f"s{shards}", shards)
        judge = judge_that_saw(paths, "me-1-live", 2.0)
        spent, moved = ops_of(reap_expired, paths, "me-1-live", 2.0, 3, lambda *a: None, sightings=judge)
        assert moved == 2   # the two late tickets; the last shard's ticket is known as committed
        assert sorted(fsops.list_names(paths.eval_queue)) == ["job-late-1", "job-late-2"]
        costs[shards] = spent
    assert costs[30] <= costs[3] + 2, costs


def ticket(name: str) -> Ticket:
    job = JobSpec(job_id=name, group_id=name, instance_id=name, sample_index=0, handler="echo", instance={})
    return Ticket(job=job, stage=Stage.EVAL)


def live_heartbeats(paths: SpoolPaths, workers: int) -> list[str]:
    names = [f"node{w:04d}-1-abcd" for w in range(workers)]
    for name in names:
        write_heartbeat(paths, name, {"node": name[:8]})
        ClaimBox(paths, name)
    return names


def test_recovery_scan_cost_is_flat_in_workers(tmp_path: Path) -> None:
    costs = {}
    for workers in (10, 200):
        paths = make_run(tmp_path / f"w{workers}")
        names = live_heartbeats(paths, workers)
        costs[workers], moved = ops_of(reap_expired, paths, names[3], 30.0, 3, lambda *a: None, random.Random(1))
        assert moved == 0
    assert costs[200] <= 1.5 * costs[10], costs


def test_the_ring_finds_dead_workers_after_the_scanning_one(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    names = live_heartbeats(paths, 40)
    for dead in names[11:13]:   # two dead in a row after names[10]
        ClaimBox(paths, dead).save(ticket(f"job-of-{dead}"))
    clock = FakeClock()
    judge = Sightings(clock=clock)
    for scanner in (names[20], names[10]):   # both have seen their successors once
        assert reap_expired(paths, scanner, 30.0, 3, lambda *a: None, random.Random(1), sightings=judge) == 0
    clock.now += 30.0
    for name in names:                       # every worker but the two beat meanwhile
        if name not in names[11:13]:
            write_heartbeat(paths, name, {"node": name[:8]})
    assert reap_expired(paths, names[20], 30.0, 3, lambda *a: None, random.Random(1), sightings=judge) == 0   # not its neighbours
    assert reap_expired(paths, names[10], 30.0, 3, lambda *a: None, random.Random(1), sightings=judge) == 2
    assert sorted(fsops.list_names(paths.eval_queue)) == [f"job-of-{d}" for d in names[11:13]]
    assert not paths.heartbeat(names[11]).exists() and paths.heartbeat(names[13]).exists()


def test_a_lease_shorter_than_three_heartbeats_is_refused() -> None:
    assert RunConfig().leases.lease_s >= 3 * RunConfig().leases.heartbeat_s
    # the default keeps liveness of 1,000 nodes modest: 3 operations per beat, at most 300/s
    assert 1000 * 3 / RunConfig().leases.heartbeat_s <= 300
    with pytest.raises(ConfigError, match=r"leases.lease_s = 20 is shorter than 3 heartbeats .*heartbeat_s = 10"):
        RunConfig().with_overrides({"leases.heartbeat_s": 10, "leases.lease_s": 20})
    assert RunConfig().with_overrides({"leases.heartbeat_s": 20, "leases.lease_s": 60}).leases.lease_s == 60


def test_large_runs_poll_cancel_stop_and_empty_queues_less_often(tmp_path: Path) -> None:
    from orchestrator.worker.dispatch import (MAX_IDLE_BACKOFF_LARGE_S, MAX_IDLE_BACKOFF_S, MIN_IDLE_BACKOFF_LARGE_S,
                                              MIN_IDLE_BACKOFF_S)
    from orchestrator.worker.engine import Worker
    from orchestrator.worker.housekeeping import CANCEL_POLL_LARGE_S, CANCEL_POLL_S, STOP_POLL_LARGE_S, STOP_POLL_S
    from orchestrator.worker.options import WorkerOptions

    periods = {}
    for workers in (3, 40):
        paths = make_run(tmp_path / f"w{workers}")
        live_heartbeats(paths, workers - 1)
        worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions())
        reap_expired(paths, worker.worker_id, 30.0, 3, lambda *a: None, random.Random(1), worker.state.count_workers)
        periods[workers] = (worker.state.poll_period(CANCEL_POLL_S, CANCEL_POLL_LARGE_S),
                            worker.state.poll_period(STOP_POLL_S, STOP_POLL_LARGE_S),
                            (worker.dispatcher.idle_backoff_floor(), worker.dispatcher.idle_backoff_cap()))
        worker.state.spool_io.shutdown()
        worker.state.heartbeat_io.shutdown()
    # an idle dispatcher's polls of its empty queue back off from a higher floor to a longer
    # period there: 3 dispatchers per node made ~10 listings/s each (benchmarks/job_ops.py)
    assert periods == {3: (CANCEL_POLL_S, STOP_POLL_S, (MIN_IDLE_BACKOFF_S, MAX_IDLE_BACKOFF_S)),
                       40: (CANCEL_POLL_LARGE_S, STOP_POLL_LARGE_S, (MIN_IDLE_BACKOFF_LARGE_S, MAX_IDLE_BACKOFF_LARGE_S))}
    assert MIN_IDLE_BACKOFF_LARGE_S > MIN_IDLE_BACKOFF_S and MAX_IDLE_BACKOFF_LARGE_S > MAX_IDLE_BACKOFF_S


def test_on_a_large_run_a_pick_costs_no_metadata_operation(tmp_path: Path) -> None:
    """The board is not published (the heartbeat carries the counts to the cluster summary) and
    the summary vouches for the registry file, so a decision needs no stat of it."""
    paths = make_run(tmp_path / "run")
    urls = [f"http://b{i}:8000/v1" for i in range(4)]
    for url in urls:
        BackendRegistry(paths).add(url)
    simulated_workers(paths, 100, urls)
    router = Router(paths, "me", node="n-me")
    router.board.change(router.choose(router.registry.read()).url, +1)   # a long task stays in flight
    assert router.board.publish_every_s == float("inf")
    spent = 0
    for _ in range(50):
        cost, backend = ops_of(lambda: router.choose(router.registry.read()))
        spent += cost + ops_of(router.board.change, backend.url, +1)[0] + ops_of(router.release, backend.url)[0]
    assert spent <= 2, spent   # at most one re-read of the summary (its period is a second here)
    router.release(backend.url)
    router.release(next(iter(router.board.inflight)))   # idle: still nothing to publish
    assert not (paths.backends_inflight / "me.json").exists()
    assert router.board.counts()["inflight"] == {} and sum(router.board.counts()["assigned"].values()) == 51


def test_on_a_large_run_a_registry_change_is_noticed_through_the_summary(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    BackendRegistry(paths).add("http://old:8000/v1")
    simulated_workers(paths, 40, ["http://old:8000/v1"])
    router = Router(paths, "me", node="n-me")
    router.choose(router.registry.read())                 # exact, then the summary is built
    BackendRegistry(paths).add("http://new:8000/v1")
    assert [b.url for b in router.registry.read().usable()] == ["http://old:8000/v1"]   # vouched: no stat
    deadline = time.monotonic() + 30
    while "http://new:8000/v1" not in [b.url for b in router.registry.read().usable()]:
        assert time.monotonic() < deadline, "the registry change was never noticed"
        router.choose(router.registry.read())             # a pick re-reads the summary when a rebuild is due
        time.sleep(0.05)
    summary = router.view.cluster.summary
    assert summary is not None and summary.large


def committed_shards(paths: SpoolPaths, shards: int, rows_each: int) -> None:
    writer = ShardWriter(paths, "w", Shards())
    for s in range(shards):
        for r in range(rows_each):
            name = f"j{s:03d}-{r}"
            writer.add(build_row(Ticket(job=JobSpec(job_id=name, group_id="g", instance_id="i", sample_index=0,
                                                    handler="echo", instance={}), stage=Stage.EVAL),
                                 {"reward": 1.0}, JobStatus.OK, "w"), name)
        writer.write(writer.take(), staging=paths.tmp)


def test_status_reads_a_bounded_sample_of_shards_unless_exact(tmp_path: Path) -> None:
    from orchestrator.cli.status import status_cmd
    from click.testing import CliRunner
    from orchestrator.report.status import snapshot

    paths = make_run(tmp_path / "run")
    committed_shards(paths, 30, 2)
    config = RunConfig.load(paths.run_config)
    sampled = snapshot(paths, config, sample_shards=10)
    assert (sampled.shards, sampled.shards_read, sampled.exact) == (30, 10, False)
    assert sampled.finished == {"ok": 60}   # scaled from 20 rows in 10 of 30 shards
    assert sampled.results is not None and sampled.results.reward_mean == 1.0
    exact = snapshot(paths, config, sample_shards=10, exact=True)
    assert (exact.shards, exact.shards_read, exact.exact, exact.finished) == (30, 30, True, {"ok": 60})
    assert exact.results is not None   # totals of the sample are estimated for the run, like `finished`
    assert (sampled.results.jobs, sampled.results.by_status) == (exact.results.jobs, exact.finished) == (60, {"ok": 60})
    small = snapshot(paths, config, sample_shards=100)   # every shard fits in the sample: exact
    assert (small.shards_read, small.exact) == (30, True)
    shown = CliRunner().invoke(status_cmd, [str(paths.root), "--json", "--exact"])
    assert shown.exit_code == 0, shown.output
    assert orjson.loads(shown.output)["finished_exact"] is True


def test_many_claimers_on_one_queue_rarely_lose_races(tmp_path: Path) -> None:
    """Claimers told how many they are spread over the queue's head instead of all walking the
    same 255 oldest tickets (at 1,000 nodes most claims were lost races)."""
    from orchestrator.spool.claims import Claimer

    paths = make_run(tmp_path / "run")
    data = Ticket(job=JobSpec(job_id="x", group_id="g", instance_id="i", sample_index=0, handler="echo",
                              instance={})).encode()
    for index in range(3000):
        (paths.init_queue / f"q{index:06d}").write_bytes(data)
    claimers = [Claimer(paths.init_queue, ClaimBox(paths, f"w{i}").dir, min_relist_s=0.0) for i in range(50)]
    for claimer in claimers:
        claimer.claimers = len(claimers)
    before, won = sum(fsops.OPS.values()), 0
    for _ in range(10):
        won += sum(claimer.claim() is not None for claimer in claimers)
    per_claim = (sum(fsops.OPS.values()) - before) / won
    assert won == 500 and per_claim <= 2.5, per_claim

"""Metadata load at 1,000 nodes: operations per recurring call, measured with fsops' own counters.

    python -m benchmarks.scale [--queued 100000] [--shards 100000] [--workers 1000] [--quick]

Every recurring operation of the engine is run for real on local disk at several sizes --
workers W (simulated with heartbeat and in-flight files), queued jobs Q, shards S -- and the
metadata operations it makes are counted by orchestrator.spool.fsops (creates, renames, unlinks,
stats, opens, listings; a listing is charged one more operation per 1,000 names it returns,
what a metadata server needs to send a large directory). From the table, the steady-state
load of a 1,000-node x 8-slot run at the pipeline benchmark's job mix is derived
(docs/scale.md explains each term).

Figures (last line, one JSON object):
  pick_ops_w1000_over_w10       operations per routing decision, W=1,000 over W=10 (<= 1.5)
  pick_median_ms_w1000          wall time of a decision with 1,000 simulated workers (<= 5)
  restart_ops_s1e5_over_s1e2    reaping a dead worker's claims with 1e5 shards vs 1e2 (<= 2)
  status_s_q1e5                 `status` with 1e5 queued jobs, seconds (<= 2)
  status_s_s1e5                 `status` with 1e5 shards (a bounded sample read), seconds
  overhead_ratio_vs_bare_queue  per-job wall time of echo jobs through real workers over a bare
                                loop doing create, claim rename, hand-off rename, unlink (<= 3)
  mds_ops_per_s_1000_nodes      the model's steady-state total (report; < 5,000)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks.common import emit_json, median, parse_args, print_table
from benchmarks.job_ops import NAMES_PER_OP, pipeline_mix
from benchmarks.overhead import end_to_end
from benchmarks.tail import poll_cost
from orchestrator.spool import fsops
from orchestrator.spool.cancel import CancelWatch
from orchestrator.spool.claims import ClaimBox, Claimer
from orchestrator.spool.cluster_summary import build_summary, rebuild_period_s
from orchestrator.spool.lease import Sightings, try_lock
from orchestrator.config import RunConfig, Shards
from orchestrator.spool.jobs import JobSpec, JobStatus, Stage
from orchestrator.spool.liveness import write_heartbeat
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import Router
from orchestrator.worker.housekeeping import ACCESS_CHECK_S
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.recovery import reap_expired, reap_found
from orchestrator.spool.rows import build_row
from orchestrator.spool.shardlog import WriterDirectory, parse_shard_name, shard_name
from orchestrator.spool.shards import ShardWriter
from orchestrator.spool.rundir import init_run
from orchestrator.report.status import snapshot
from orchestrator.spool.tickets import Ticket

ACCESS_CHECK_STATS = 7   # the directories a worker re-checks (WorkerState.own_directories)

SLOW_SCALE = 0.25   # stage durations of the idle-poll measurement (x0.05 makes idle episodes 20x as frequent)


def charged() -> float:
    """Operations so far, listings charged by the names they returned."""
    return sum(fsops.OPS.values()) + fsops.LISTED["names"] / NAMES_PER_OP


def measure(call: Callable[[], Any], repeat: int = 1) -> tuple[float, float, Any]:
    """(operations per call, median seconds per call, last result)."""
    before, times, result = charged(), [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return (charged() - before) / repeat, median(times), result


def new_run(base: Path, name: str) -> SpoolPaths:
    paths, _ = init_run(base / name)
    return paths


def ticket(name: str, stage: Stage = Stage.EVAL) -> Ticket:
    job = JobSpec(job_id=name, group_id=name, instance_id=name, sample_index=0, handler="echo", instance={})
    return Ticket(job=job, stage=stage)


def queue_tickets(paths: SpoolPaths, queue: Path, count: int) -> None:
    """`count` small tickets, written directly (fast: only their names matter here)."""
    data = ticket("x").encode()
    for index in range(count):
        (queue / f"q{index:07d}").write_bytes(data)


def simulate_workers(paths: SpoolPaths, workers: int, urls: list[str]) -> list[str]:
    """W workers as a worker writes them: a heartbeat carrying its in-flight counts (what the
    cluster summary reads on large runs), a board (what small runs read) and a claim directory."""
    names = []
    for w in range(workers):
        name = f"node{w:04d}-1-abcd"
        load = {"inflight": {urls[w % len(urls)]: 1}, "assigned": {urls[w % len(urls)]: 5}}
        write_heartbeat(paths, name, {"node": f"node{w:04d}", "load": load})
        (paths.backends_inflight / f"{name}.json").write_bytes(orjson.dumps({"worker": name, **load}))
        ClaimBox(paths, name)
        names.append(name)
    return names


# -- the operations -----------------------------------------------------------------------------
def claim_cost(base: Path, queued: int, claimers: int, claims_each: int = 3) -> float:
    """Operations per successful claim: `claimers` workers take turns on one queue of `queued`."""
    paths = new_run(base, f"claim-q{queued}-w{claimers}")
    queue_tickets(paths, paths.init_queue, queued)
    boxes = [ClaimBox(paths, f"w{i}") for i in range(claimers)]
    who = [Claimer(paths.init_queue, box.dir, min_relist_s=0.0) for box in boxes]
    for claimer in who:   # what a worker's recovery scans tell its claimers of the shared queues
        claimer.claimers = claimers
    before, won = charged(), 0
    for _ in range(claims_each):
        for claimer in who:
            won += claimer.claim() is not None
    return (charged() - before) / max(won, 1)


def advance_cost(base: Path) -> float:
    paths = new_run(base, "advance")
    box = ClaimBox(paths, "w")
    tickets = [ticket(f"a{i}", Stage.RUN) for i in range(100)]
    for t in tickets:
        box.save(t)
    before = charged()
    for t in tickets:
        box.advance(t, paths.eval_queue)
    return (charged() - before) / len(tickets)


def commit_cost(base: Path, rows_per_shard: int) -> float:
    """Operations per job of committing a shard of `rows_per_shard` rows and dropping their tickets."""
    paths = new_run(base, f"commit-{rows_per_shard}")
    box = ClaimBox(paths, "w")
    writer = ShardWriter(paths, "w", Shards())
    names = [f"c{i}" for i in range(rows_per_shard)]
    for name in names:
        box.save(ticket(name))
        writer.add(build_row(ticket(name), {}, JobStatus.OK, "w"), name)
    writer.write(writer.take(), staging=box.dir)   # the writer's registration is a one-off: not counted
    for name in names:
        box.save(ticket(name))
        writer.add(build_row(ticket(name), {}, JobStatus.OK, "w"), name)
    before = charged()
    writer.write(writer.take(), staging=box.dir)
    for name in names:
        box.drop(name)
    return (charged() - before) / rows_per_shard


def heartbeat_cost(base: Path) -> float:
    """What the engine does per beat: check its claim directory is still its own, rewrite the record."""
    paths = new_run(base, "heartbeat")
    box = ClaimBox(paths, "w")
    ops, _, _ = measure(lambda: (fsops.mtime(box.dir), write_heartbeat(paths, "w", {"node": "n"})), 20)
    return ops


def pick_cost(base: Path, workers: int, picks: int = 200) -> dict[str, float]:
    """A routing decision as a task starts (registry, cluster view, own board +1) and its release (-1)."""
    paths = new_run(base, f"pick-w{workers}")
    urls = [f"http://b{i}:8000/v1" for i in range(16)]
    for url in urls:
        BackendRegistry(paths).add(url)
    simulate_workers(paths, workers, urls)
    router = Router(paths, "me-1-abcd", node="node-me")
    # a process's first decision reads the view once; its node has a task in flight throughout
    router.board.change(router.choose(router.registry.read()).url, +1)
    # Another worker is rebuilding the summary (the case of all workers but one): this one's
    # decisions only read it. The rebuild's own cost is measured below and bounded in the model.
    rebuilding = try_lock(router.view.cluster.lock_file, "another-rebuilder")   # held throughout the measure

    def decide() -> None:
        backend = router.choose(router.registry.read())
        router.board.change(backend.url, +1)
        router.release(backend.url)

    ops, seconds, _ = measure(decide, picks)
    assert rebuilding is not None
    rebuilding.release()
    rebuild_ops, _, _ = measure(lambda: router.view.cluster._rebuild_if_first(None, None))
    return {"ops": ops, "ms": seconds * 1e3, "rebuild_ops": rebuild_ops}


def rare_recovery_cost(base: Path, workers: int) -> float:
    """A large run's recovery beyond the dead workers the summary's rebuilder found (those are
    the restart cost): the rare duties of a full scan, once per lease for the whole run."""
    paths = new_run(base, f"sweep-w{workers}")
    simulate_workers(paths, workers, ["http://b:1/v1"])
    rebuild = build_summary(paths, 30.0)
    assert rebuild.sweep and not rebuild.dead
    ops, _, _ = measure(lambda: reap_found(paths, "node0000-1-abcd", 30.0, 3, lambda *a: None, rebuild), 5)
    return ops


def recovery_cost(base: Path, workers: int) -> float:
    paths = new_run(base, f"recovery-w{workers}")
    names = simulate_workers(paths, workers, ["http://b:1/v1"])
    rng = random.Random(1)
    ops, _, _ = measure(lambda: reap_expired(paths, names[0], 30.0, 3, lambda *a: None, rng), 5)
    return ops


def restart_cost(base: Path, shards: int) -> float:
    """Reaping a dead worker's claims (2 tickets, 1 committed but not dropped) among `shards` shards."""
    paths = new_run(base, f"restart-s{shards}")
    directory = WriterDirectory(paths)
    for w in range(100):   # other writers' shards: only their names exist
        other = directory.register(f"other{w:03d}-1-abcd")
        for seq in range(1, shards // 100 + 1):
            (paths.shards / shard_name(other, seq)).touch()
    dead = "node9-1-dead"
    box = ClaimBox(paths, dead)
    writer = ShardWriter(paths, dead, Shards())
    for name in ("done-1", "late-1"):
        box.save(ticket(name))
    writer.add(build_row(ticket("done-1"), {}, JobStatus.OK, dead), "done-1")
    writer.write(writer.take(), staging=box.dir)
    write_heartbeat(paths, dead, {"node": "node9", "shards": writer.progress()})
    clock = [0.0]   # the judge has seen the dead worker's heartbeat stay the same for a lease
    judge = Sightings(clock=lambda: clock[0])
    reap_expired(paths, "me-1-live", 30.0, 3, lambda *a: None, sightings=judge)
    clock[0] += 30.0
    ops, _, moved = measure(lambda: reap_expired(paths, "me-1-live", 30.0, 3, lambda *a: None, sightings=judge))
    assert moved == 1, moved
    return ops


def status_cost(base: Path, queued: int, shards: int, exact: bool = False) -> dict[str, float]:
    """`status` (finished figures from a bounded sample of shards, or every shard with `exact`)."""
    paths = new_run(base, f"status-q{queued}-s{shards}-{exact}")
    queue_tickets(paths, paths.init_queue, queued)
    writer = ShardWriter(paths, "w", Shards())
    writer.add(build_row(ticket("done-1"), {}, JobStatus.OK, "w"), "done-1")
    writer.write(writer.take(), staging=paths.tmp)
    first = next(paths.shards.glob("*.parquet"))
    name, _ = parse_shard_name(first.name) or ("", 0)
    data = first.read_bytes()
    for seq in range(2, shards + 1):   # the same one-row shard under S names (only names matter)
        if seq % 50_000 == 0:          # a fresh source: a file takes at most 65,000 links (ext4)
            first = paths.shards / shard_name(name, seq)
            first.write_bytes(data)
            continue
        os.link(first, paths.shards / shard_name(name, seq))
    config = RunConfig.load(paths.run_config)
    ops, seconds, snap = measure(lambda: snapshot(paths, config, exact=exact), 3)
    assert snap.queued["init"] == queued and snap.finished == {"ok": shards}, snap.finished
    return {"ops": ops, "s": seconds}


def cancel_poll_cost(base: Path, requests: int) -> float:
    paths = new_run(base, f"cancel-{requests}")
    for index in range(requests):
        (paths.cancel / f"sub-{index:07d}-0000").touch()
    watch = CancelWatch(paths)
    ops, _, _ = measure(watch.refresh, 20)
    return ops


def stop_poll_cost(base: Path) -> float:
    paths = new_run(base, "stop")
    ops, _, _ = measure(lambda: fsops.mtime(paths.stop_request), 20)
    return ops


# -- the bare queue and the whole path ------------------------------------------------------------
def bare_queue_s_per_job(base: Path, jobs: int) -> float:
    """The minimum a job needs on the spool: create its ticket, claim it, hand it on, unlink it."""
    paths = new_run(base, "bare")
    claims = paths.claims("bare")
    claims.mkdir(parents=True, exist_ok=True)
    data = ticket("x").encode()
    started = time.perf_counter()
    for index in range(jobs):
        name = f"b{index:07d}"
        fsops.write_atomic(paths.init_queue / name, data, paths.tmp)
        fsops.rename(paths.init_queue / name, claims / name)
        fsops.rename(claims / name, paths.eval_queue / name)
        fsops.rename(paths.eval_queue / name, claims / name)
        fsops.unlink(claims / name)
    return (time.perf_counter() - started) / jobs


# -- the model -------------------------------------------------------------------------------------
def steady_state(per_call: dict[str, float], mix: dict[str, float], config: RunConfig, nodes: int,
                 slots: int, run_s: float, workers_alive: int, idle_per_worker_second: float,
                 ) -> list[tuple[str, float, str]]:
    """Metadata operations per second of the whole run, term by term: (term, ops/s, how).

    `mix` is benchmarks.job_ops at the pipeline mix: per-job operations by duty;
    `idle_per_worker_second` its idle polls, measured at less compressed time. The INIT claim from the shared queue is charged at its contended
    cost (per_call["claim"]); the mix's other claims (hand-off misses) as measured.
    """
    lease = config.leases.lease_s
    jobs_per_s = nodes * slots / run_s
    period = rebuild_period_s(workers_alive, config.llm.view_s)   # rebuilt, and re-read, once per period
    idle_per_s = idle_per_worker_second
    rebuild_ops = per_call["rebuild"]
    own = mix["submit_per_job"] + mix["job_per_job"] + mix["commit_per_job"]
    # One INIT claim per batch of jobs.batch_size (its rename at the contended cost), plus the
    # mix's other claims (eval queue, hand-off misses) as measured.
    batch = mix.get("batch_size", 1)
    claims = per_call["claim"] / batch + max(0.0, mix["claim_per_job"] - 1.0 / batch)
    terms = [
        ("jobs: submit, stage steps, shard + unlink (pipeline mix)", jobs_per_s * own,
         f"{jobs_per_s:.0f} jobs/s x {own:.2f} ops/job"),
        ("jobs: claims (the INIT one contended)", jobs_per_s * claims, f"{jobs_per_s:.0f} jobs/s x {claims:.2f} ops/job"),
        ("idle polls of empty queues", nodes * idle_per_s, f"{idle_per_s:.2f} ops/s per node"),
        ("routing (one pick + release per job)", jobs_per_s * per_call["pick"], f"{per_call['pick']:.2f} ops/pick"),
        ("routing: own board published", 0.0, "none: the heartbeat carries the counts"),
        ("cluster view: each node re-reads the summary", nodes / period, f"1 open / {period:g} s"),
        ("cluster view: summary rebuilds", rebuild_ops / period, f"{rebuild_ops:.0f} ops / {period:g} s"),
        ("heartbeats", nodes * per_call["heartbeat"] / config.leases.heartbeat_s,
         f"{per_call['heartbeat']:.1f} ops / {config.leases.heartbeat_s:g} s"),
        ("cancel poll", 0.0, "none: cancel/ is in the summary"),
        ("stop poll", 0.0, "none: control/stop is in the summary"),
        ("recovery (dead workers: by the rebuilder; rare duties once per lease)", per_call["recovery"] / lease,
         f"{per_call['recovery']:.1f} ops / {lease:g} s for the run"),
        ("claim audit", nodes * 1.0 / lease, f"1 listing / {lease:g} s"),
        ("access check (directories others could write into)", nodes * ACCESS_CHECK_STATS / ACCESS_CHECK_S,
         f"{ACCESS_CHECK_STATS} stats / {ACCESS_CHECK_S:g} s"),
    ]
    return terms


# --quick: the smoke test's size (tests/test_benchmarks.py); --queued 10000 --shards 10000
# --workers 300 is a medium size (about a minute on an idle machine)
QUICK = {"queued": 400, "shards": 200, "workers": 120, "mix_jobs": 16, "slow_jobs": 4, "e2e_jobs": 40,
         "bare_jobs": 200}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", type=int, default=100_000, help="Q: the long queue measured (beside 100)")
    parser.add_argument("--shards", type=int, default=100_000, help="S: the many shards measured (beside 100)")
    parser.add_argument("--workers", type=int, default=1000, help="W: the many workers measured (beside 10, 100; > 100)")
    parser.add_argument("--mix-jobs", type=int, default=400, help="jobs of the pipeline mix at durations x0.05")
    parser.add_argument("--slow-jobs", type=int, default=200, help=f"jobs of the pipeline mix at durations x{SLOW_SCALE:g}")
    parser.add_argument("--e2e-jobs", type=int, default=2000, help="echo jobs through 4 real workers")
    parser.add_argument("--bare-jobs", type=int, default=2000, help="jobs through the bare queue")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the run directories (local disk)")
    args = parse_args(parser, QUICK)
    big_q, big_s, big_w = args.queued, args.shards, args.workers
    base = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=args.dir))
    try:
        table: list[list[Any]] = []
        per_call: dict[str, float] = {}

        # each claimer takes up to 3 (Q=100) or 50 tickets (a worker's cached listing lasts that long)
        claims = {(q, w): claim_cost(base, q, w, 3 if q == 100 else min(50, max(1, big_q // 200))) for q in (100, big_q)
                  for w in (1, 10, 100)}
        for (q, w), ops in claims.items():
            table.append(["claim (rename; relist when dry)", f"Q={q} W={w}", ops])
        per_call["claim"] = claims[(big_q, 100)]   # a long queue, the most claimers measured
        table.append(["advance (save + hand to next queue)", "any", advance_cost(base)])
        for rows in (1, 20, 100):
            table.append(["commit (shard + drop tickets), per job", f"{rows} rows/shard", commit_cost(base, rows)])
        per_call["heartbeat"] = heartbeat_cost(base)
        table.append(["heartbeat", "any", per_call["heartbeat"]])
        picks = {w: pick_cost(base, w) for w in (10, 100, big_w)}
        for w, p in picks.items():
            table.append(["routing pick (+ release)", f"W={w}", p["ops"]])
            table.append(["  cluster view rebuild (one worker, bounded rate)", f"W={w}", p["rebuild_ops"]])
        per_call["pick"], per_call["rebuild"] = picks[big_w]["ops"], picks[big_w]["rebuild_ops"]
        cancel = {requests: cancel_poll_cost(base, requests) for requests in (0, 100)}
        for requests, ops in cancel.items():
            table.append(["cancel poll", f"{requests} requests", ops])
        per_call["cancel"] = cancel[0]
        per_call["stop"] = stop_poll_cost(base)
        table.append(["stop poll", "any", per_call["stop"]])
        recovery = {w: recovery_cost(base, w) for w in (10, 100, big_w)}
        for w, ops in recovery.items():
            table.append(["recovery scan (no cluster summary)", f"W={w}", ops])
        rare = {w: rare_recovery_cost(base, w) for w in (100, big_w)}
        for w, ops in rare.items():
            table.append(["recovery's rare duties (by the rebuilder)", f"W={w}", ops])
        per_call["recovery"] = rare[big_w]
        restart = {s: restart_cost(base, s) for s in (100, big_s)}
        for s, ops in restart.items():
            table.append(["restart: reap a dead worker's claims", f"S={s}", ops])
        status = {(q, s): status_cost(base, q, s) for q, s in ((100, 100), (big_q, 100), (100, big_s))}
        for (q, s), st in status.items():
            table.append(["status (sampled shards)", f"Q={q} S={s}", st["ops"]])
        exact_s = min(1000, big_s)
        status_exact = status_cost(base, 100, exact_s, exact=True)
        table.append(["status --exact", f"Q=100 S={exact_s}", status_exact["ops"]])
        polls = {s: poll_cost(base, s, 100, 50) for s in (100, big_s)}
        for s, poll in polls.items():
            table.append(["reader poll (100 open writers)", f"S={s}", poll["ops_per_poll"]])
        print_table("metadata operations per call (fsops counters; listings + 1 per 1,000 names)",
                    ["operation", "size", "ops/call"], table)

        mix = pipeline_mix(base, args.mix_jobs, 0.05)
        print_table("the pipeline mix through a real worker (benchmarks.job_ops), operations by duty",
                    ["duty", "ops"], [[k, v] for k, v in mix.items()])
        # idle episodes come as often as jobs end: at x0.05 twenty times as often as for real
        slow = pipeline_mix(base, args.slow_jobs, SLOW_SCALE)
        print_table(f"the same at durations x{SLOW_SCALE:g}: idle polls per worker-second",
                    ["duty", "ops"], [[k, v] for k, v in slow.items() if k.endswith("_per_s") or k == "seconds"])
        e2e = end_to_end(base, args.e2e_jobs, 4)
        bare = bare_queue_s_per_job(base, args.bare_jobs)
        e2e_s_per_job = e2e["seconds"] / e2e["jobs"]
        print_table("echo jobs through real workers vs a bare queue, same disk, same run",
                    ["path", "jobs/s", "ms/job", "metadata ops/job"],
                    [["4 local workers, whole path", e2e["jobs_per_s"], e2e_s_per_job * 1e3, e2e["metadata_ops_per_job"]],
                     ["bare loop: create, claim, hand-off, unlink", 1 / bare, bare * 1e3, 5.0]])

        config = RunConfig()
        nodes, slots, run_s = 1000, 8, 6.0   # the pipeline benchmark's RUN stage: uniform 2-10 s
        terms = steady_state(per_call, mix, config, nodes, slots, run_s, nodes, slow["per_worker_second"])
        total = sum(ops for _, ops, _ in terms)
        print_table(f"steady state, {nodes} nodes x {slots} RUN slots, RUN mean {run_s:g} s (defaults of run.toml)",
                    ["term", "ops/s", "from"], [[t, ops, how] for t, ops, how in terms] + [["total", total, ""]])
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    emit_json({
        "pick_ops_w1000_over_w10": round(picks[big_w]["ops"] / picks[10]["ops"], 3),
        "pick_ops_w10": round(picks[10]["ops"], 2), "pick_ops_w1000": round(picks[big_w]["ops"], 2),
        "pick_median_ms_w1000": round(picks[big_w]["ms"], 3),
        "restart_ops_s1e5_over_s1e2": round(restart[big_s] / restart[100], 3),
        "status_s_q1e5": round(status[(big_q, 100)]["s"], 3),
        "status_s_s1e5": round(status[(100, big_s)]["s"], 3),
        "status_ops_s1e5_over_s1e2": round(status[(100, big_s)]["ops"] / status[(100, 100)]["ops"], 2),
        "mds_ops_per_job": round(sum(ops for _, ops, _ in terms[:2]) / (nodes * slots / run_s), 2),
        "overhead_ratio_vs_bare_queue": round(e2e_s_per_job / bare, 2),
        "mds_ops_per_s_1000_nodes": round(total),
        "mds_ops_per_s_1000_nodes_jobs": round(terms[0][1] + terms[1][1]),
        "mds_ops_per_s_1000_nodes_cluster_size_terms": round(total - terms[0][1] - terms[1][1] - terms[3][1]),
        "recovery_ops_w1000_over_w10": round(recovery[big_w] / recovery[10], 2),
        "idle_polls_per_worker_s": {"x0.05": round(mix["per_worker_second"], 3),
                                    f"x{SLOW_SCALE:g}": round(slow["per_worker_second"], 3)},
        "sizes": {"W": big_w, "Q": big_q, "S": big_s},
    })
    shutil.rmtree(base, ignore_errors=True)   # after the figures: 3e5 files take a while to remove


if __name__ == "__main__":
    main()

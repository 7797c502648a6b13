"""`launch --nodes` on the real cluster: throughput, preemption, requeue, stop (each test states the nodes,
partitions and limits it needs: tests/slurm_probe.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest

from orchestrator.config import RunConfig
from orchestrator.slurm.cluster import max_array_size
from orchestrator.slurm.queries import slurm_warnings
from orchestrator.report.status import snapshot
from tests.core.util import cli, wait_until, write_jsonl
from tests.slurm.conftest import JobJanitor
from tests.slurm.util import events, exactly_once, heartbeats, launch, logs_containing, queued, sleep_run, wait_rows
from tests.slurm_probe import Cluster, require

pytestmark = pytest.mark.slurm


@pytest.mark.slurm(nodes=4)
def test_200_sleep_jobs_on_4_nodes_then_stop_drains(run_root: Path, janitor: JobJanitor, slurm_cluster: Cluster) -> None:
    paths = sleep_run(run_root, jobs=0, run_s=0)
    array, out = launch(paths, "--nodes", "4")
    janitor.add(array)
    assert "tail -F" in out and f"{array}_0_0_log.out" in out
    # Submit once the 4 workers serve, so that no node finds the work already done.
    wait_until(lambda: len([b for b in heartbeats(paths) if b.get("state") == "running"]) == 4, 120, "4 workers")
    tasks = write_jsonl(run_root.parent / "tasks200.jsonl", [{"handler": "sleep", "instance": {"run": 0.2}}] * 200)
    cli("submit", str(paths.root), str(tasks))
    table = wait_rows(paths, 200)
    exactly_once(table, 200)
    nodes = set(table["node"])
    assert len(nodes) == 4 and nodes <= slurm_cluster.default_partition.nodes, Counter(table["node"])

    beats = heartbeats(paths)
    assert {b["slurm_array_job_id"] for b in beats} == {array}
    assert {b["slurm_array_task_id"] for b in beats} == {"0", "1", "2", "3"}
    assert {b["node"] for b in beats} == nodes
    # Healthy workers and tasks: status has nothing to say about Slurm.
    assert slurm_warnings(snapshot(paths, RunConfig.load(paths.run_config), with_rows=False).workers) == []

    cli("stop", str(paths.root))            # drain: the tasks end by themselves, COMPLETED
    wait_until(lambda: not queued(array), 60, "the drained tasks to leave squeue")
    assert logs_containing(paths, "Job completed successfully")


@pytest.mark.slurm(nodes=4)
@pytest.mark.parametrize("how", [pytest.param("preempt", marks=pytest.mark.slurm(preemption=True)), "requeue",
                                 "site-signal"])
def test_a_task_requeued_midway_loses_nothing_and_resumes(how: str, run_root: Path, janitor: JobJanitor,
                                                          slurm_cluster: Cluster) -> None:
    jobs = 120   # ~20 s of RUN on 8 slots: work is left when the task restarts (~12 s after the signal)
    paths = sleep_run(run_root, jobs=jobs, run_s=1.5)
    site = ["--signal", "USR1"] if how == "site-signal" else []
    array, _ = launch(paths, "--nodes", "4", "--init-pool", "2", "--run-pool", "2", "--eval-pool", "2", *site)
    janitor.add(array)
    wait_until(lambda: len(events(paths, "finished")) >= 30, 180, "30 finished jobs")
    if how == "site-signal":
        # A site that warns with USR1: the task returns its claims and requeues on USR1 (and would ignore USR2).
        subprocess.run(["scancel", "--signal=USR1", f"{array}_2"], check=True, timeout=30)
        wait_until(lambda: bool(logs_containing(paths, f"warning signal USR1: claims returned, requeueing {array}_2")),
                   120, "the USR1 requeue")
    elif how == "preempt":
        # Its nodes are held exclusively: a job in the higher-tier partition, on one of them, preempts one task.
        high_tier = slurm_cluster.preempting_partition(slurm_cluster.default_partition)
        assert high_tier is not None   # the test's slurm mark asked for it
        node = min(b["node"] for b in heartbeats(paths))
        high = subprocess.run(["sbatch", "--parsable", "-p", high_tier.name, "-w", node, "-o", "/dev/null",
                               "--wrap", "sleep 2"],
                              capture_output=True, text=True, check=True).stdout.strip()
        janitor.add(high.split(";")[0])
        wait_until(lambda: bool(logs_containing(paths, "warning signal USR2: claims returned, requeueing")), 120,
                   "a preempted task")
    else:
        subprocess.run(["scontrol", "requeue", f"{array}_1"], check=True, timeout=30)
        wait_until(lambda: bool(logs_containing(paths, "SIGTERM, returning claims now")), 120, "the SIGTERM")

    if how == "requeue":
        # SIGTERM without warning: srun answers it by killing the step ("srun: forcing job
        # termination"), so the worker returns its claims only if it wins that race by a few ms;
        # what it could not return comes back through its lease.
        wait_until(lambda: bool(events(paths, "returned") or events(paths, "requeued")), 60,
                   "the claims to come back, returned or through the lease")
    else:
        # The warning signal: the task returned its claims at once, before anything killed it.
        wait_until(lambda: bool(events(paths, "returned")), 60, "the claims to be returned")
    # The task restarts and its fresh worker claims jobs.
    wait_until(lambda: len(events(paths, "worker_started")) >= 5, 180, "the requeued task to restart")
    restarted = [b for b in heartbeats(paths) if int(b.get("slurm_restart_count", 0)) >= 1]
    assert restarted and restarted[0]["slurm_array_job_id"] == array
    table = wait_rows(paths, jobs)
    exactly_once(table, jobs)
    # It resumed: a fresh worker serving the same spool (rows by it depend on how much work was left).
    assert restarted[0]["state"] == "running"
    assert restarted[0]["worker_id"] in {e["worker"] for e in events(paths, "worker_started")}

    result = cli("stop", str(paths.root), "--cancel")
    assert "all workers stopped" in result.stdout
    assert queued(array) == []


def test_stop_cancel_removes_pending_and_running_tasks(run_root: Path, janitor: JobJanitor, slurm_cluster: Cluster) -> None:
    nodes = len(slurm_cluster.default_partition.nodes)
    require(max_array_size=(nodes + 2, 1 << 30))   # one array, two tasks more than the nodes
    paths = sleep_run(run_root, jobs=0, run_s=0.1)
    array, _ = launch(paths, "--nodes", str(nodes + 2))      # exclusive tasks: two wait, PENDING
    janitor.add(array)
    wait_until(lambda: len([b for b in heartbeats(paths) if b.get("state") == "running"]) == nodes, 120,
               f"{nodes} workers")
    assert len(queued(array)) == nodes + 2
    shown = cli("status", str(paths.root)).stdout   # the waiting tasks, with Slurm's reason
    assert re.search(r"Slurm tasks pending: 2 \((Priority|Resources)", shown), shown
    pending = orjson.loads(cli("status", str(paths.root), "--json").stdout)["slurm"]["pending"]
    assert sorted(t for tasks in pending.values() for t in tasks) == [f"{array}_{nodes}", f"{array}_{nodes + 1}"]
    cli("stop", str(paths.root), "--cancel")
    assert queued(array) == []


@pytest.mark.slurm(max_array_size=(2, 16))   # small enough that limit + 1 workers fit on this machine
def test_an_array_above_max_array_size_is_split_and_every_part_serves(run_root: Path, janitor: JobJanitor) -> None:
    limit = max_array_size()   # scripts/slurm-up.sh sets MaxArraySize=8 so that launch has to split
    require(cpus=limit + 1)    # every task shares a node (one CPU each)
    paths = sleep_run(run_root, jobs=0, run_s=0)
    out = cli("launch", str(paths.root), "--time", "00:30:00", "--nodes", str(limit + 1),
              "--shared", "--cpus-per-node", "1", "--init-pool", "1", "--run-pool", "1", "--eval-pool", "1").stdout
    arrays = re.findall(r"(\d+) \((\d+) tasks?\)", out)
    for job_id, _ in arrays:
        janitor.add(job_id)
    halves = [(limit + 2) // 2, (limit + 1) // 2]
    assert [int(size) for _, size in arrays] == halves, out     # as even as possible
    (first, _), (second, _) = arrays
    wait_until(lambda: len([b for b in heartbeats(paths) if b.get("state") == "running"]) == limit + 1, 180,
               f"{limit + 1} workers")
    served = {(b["slurm_array_job_id"], b["slurm_array_task_id"]) for b in heartbeats(paths)}
    assert served == {(first, str(i)) for i in range(halves[0])} | {(second, str(i)) for i in range(halves[1])}
    tasks = write_jsonl(run_root.parent / "tasks70.jsonl", [{"handler": "sleep", "instance": {"run": 0.1}}] * 70)
    cli("submit", str(paths.root), str(tasks))
    exactly_once(wait_rows(paths, 70), 70)
    cli("stop", str(paths.root), "--cancel")      # finds both arrays through the heartbeats
    assert queued(first) == [] and queued(second) == []


def test_status_flags_a_worker_whose_task_left_slurm(janitor: JobJanitor) -> None:
    job = janitor.add(subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    wait_until(lambda: not queued(job), 60, "the job to finish")
    ghost = {"alive": True, "worker_id": "ghost", "node": "node1", "slurm_job_id": job}
    warnings = slurm_warnings([ghost])
    assert any(job in w and "ghost" in w and ("left the queue" in w or "gone from squeue" in w) for w in warnings), warnings
    assert slurm_warnings([{**ghost, "alive": False}]) == []


@pytest.mark.slurm(nodes=3)   # 2 held by the runners, the scorers share the rest
def test_eval_only_array_scores_what_another_array_ran(run_root: Path, janitor: JobJanitor) -> None:
    jobs = 60
    paths = sleep_run(run_root, jobs=jobs, run_s=0.2)
    runners, _ = launch(paths, "--nodes", "2", "--stages", "init,run")
    scorers, _ = launch(paths, "--nodes", "2", "--stages", "eval", "--shared", "--cpus-per-node", "1")
    janitor.add(runners)
    janitor.add(scorers)
    table = wait_rows(paths, jobs)
    exactly_once(table, jobs)
    wait_until(lambda: len(events(paths, "worker_started")) >= 4, 120, "all 4 workers")
    started = events(paths, "worker_started")
    eval_only = {e["worker"] for e in started if e.get("stages") == ["eval"]}
    run_nodes = {e["node"] for e in started if e.get("stages") == ["init", "run"]}
    assert len(eval_only) == 2 and len(run_nodes) == 2
    assert set(table["worker"]) <= eval_only, "rows are written by the EVAL-only workers"
    assert set(table["node"]) <= run_nodes, "INIT and RUN happened on the other array's nodes"
    cli("stop", str(paths.root), "--cancel")
    assert queued(runners) == [] and queued(scorers) == []


@pytest.mark.slurm(accounting=True)
def test_a_worker_whose_spool_vanishes_ends_its_task_failed(run_root: Path, janitor: JobJanitor) -> None:
    paths = sleep_run(run_root, jobs=0, run_s=0)
    array, _ = launch(paths, "--nodes", "1", "--shared", "--cpus-per-node", "1")
    janitor.add(array)
    wait_until(lambda: bool(heartbeats(paths)), 120, "the worker's heartbeat")
    # The spool becomes unreachable under the worker (as when a mount goes away).
    paths.workers.rename(paths.root / "workers.gone")
    paths.tmp.rename(paths.root / "tmp.gone")
    wait_until(lambda: not queued(array), 120, "the task to end")
    assert logs_containing(paths, "WorkerFailed"), "the worker exits non-zero, so does the task"
    def state() -> list[str]:
        return subprocess.run(["sacct", "-X", "-n", "-P", "-j", array, "-o", "State"],
                              capture_output=True, text=True).stdout.split()

    # slurmdbd records the end a moment after squeue forgets the task.
    wait_until(lambda: bool(state()) and state()[0] not in ("PENDING", "RUNNING"), 60, "sacct's final state")
    assert state() == ["FAILED"]


@pytest.mark.slurm(nodes=2)
def test_launch_wait_returns_when_drained_with_no_task_left(run_root: Path, janitor: JobJanitor) -> None:
    paths = sleep_run(run_root, jobs=40, run_s=0.1)
    array, out = launch(paths, "--nodes", "2", "--wait")
    janitor.add(array)
    assert "drained: 40 ok; arrays" in out
    exactly_once(wait_rows(paths, 40), 40)
    assert queued(array) == []


def test_a_task_reaching_its_time_limit_requeues_itself(run_root: Path, janitor: JobJanitor) -> None:
    paths = sleep_run(run_root, jobs=0, run_s=0)
    out = cli("launch", str(paths.root), "--nodes", "1", "--shared", "--cpus-per-node", "1",
              "--time", "1", "--signal-delay", "50").stdout
    array = janitor.add(out.split("Slurm array ")[1].split()[0])
    # The warning comes ~50 s before the 1-minute limit: the worker returns its claims, the task
    # requeues itself and comes back with a fresh time limit.
    wait_until(lambda: any(int(b.get("slurm_restart_count", 0)) >= 1 and b.get("state") == "running"
                           for b in heartbeats(paths)), 150, "the task to come back after its time limit")
    assert logs_containing(paths, f"warning signal USR2: claims returned, requeueing {array}")
    cli("stop", str(paths.root), "--cancel")
    assert queued(array) == []


@pytest.mark.slurm(nodes=4)
def test_claims_of_a_task_killed_without_warning_come_back_through_the_lease(
        run_root: Path, janitor: JobJanitor) -> None:
    jobs = 120
    paths = sleep_run(run_root, jobs=jobs, run_s=1.0)
    array, _ = launch(paths, "--nodes", "4", "--init-pool", "2", "--run-pool", "2", "--eval-pool", "2")
    janitor.add(array)
    wait_until(lambda: len(events(paths, "finished")) >= 20, 180, "20 finished jobs")
    # SIGKILL to the worker process (by its heartbeat's pid; emulated nodes share this host):
    # no checkpoint, no SIGTERM handler, the task just vanishes with its claims. (`scancel -s KILL`
    # would not do: Slurm turns it into a cancel, SIGTERM first.)
    victim = next(b for b in heartbeats(paths) if b.get("slurm_array_task_id") == "1")
    os.kill(int(victim["pid"]), signal.SIGKILL)
    table = wait_rows(paths, jobs)
    exactly_once(table, jobs)
    assert max(table["attempt"]) >= 2, "expired claims went back to their queue with attempt + 1"
    cli("stop", str(paths.root), "--cancel")
    assert queued(array) == []

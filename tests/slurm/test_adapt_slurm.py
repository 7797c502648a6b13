"""`hpc-rollout adapt` on the real cluster: grow with the queue, shrink to --min, two controllers, one killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import orjson
import pytest

from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.adapt import state_path
from tests.core.util import cli, wait_until, write_jsonl
from tests.slurm.conftest import JobJanitor
from tests.slurm.util import exactly_once, launch, sleep_run, wait_rows

pytestmark = pytest.mark.slurm

MIN, MAX = 1, 3
JOBS = 48


def adapt_tasks(paths: SpoolPaths, kind: str = "all") -> dict[str, tuple[str, bool]]:
    """Tasks of every array adapt launched on this run, as squeue sees them: task -> (state, kept)."""
    keep_of = {}
    for record in paths.logs.glob(f"adapt-{kind}-*/slurm.json"):
        for array in orjson.loads(record.read_bytes())["arrays"]:
            keep_of[str(array["job_id"])] = "-keep-" in record.parent.name
    if not keep_of:
        return {}
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(keep_of)],
                         capture_output=True, text=True, timeout=30).stdout
    return {task: (state, keep_of[task.split("_")[0]]) for task, state in (line.split() for line in out.splitlines())}


def state(paths: SpoolPaths, kind: str = "all") -> dict:
    path = state_path(paths, kind)
    return orjson.loads(path.read_bytes()) if path.exists() else {}


class CountWatch:
    """Samples the number of adapt tasks in squeue (running + pending) while the test runs."""

    def __init__(self, paths: SpoolPaths, kind: str = "all") -> None:
        self.paths, self.kind, self.most, self.done = paths, kind, 0, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(0.5):
            self.most = max(self.most, len(adapt_tasks(self.paths, self.kind)))

    def stop(self) -> int:
        self.done.set()
        self.thread.join(10)
        return self.most


@pytest.fixture
def controllers(run_root: Path, janitor: JobJanitor) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)
    paths = SpoolPaths.of(run_root)
    for record in paths.logs.glob("adapt-*/slurm.json"):
        for array in orjson.loads(record.read_bytes())["arrays"]:
            janitor.add(str(array["job_id"]))
    cli("stop", str(paths.root), "--cancel", check=False, timeout=180)


FULL_WORKERS = ("--min", str(MIN), "--max", str(MAX), "--init-pool", "2", "--run-pool", "2", "--eval-pool", "2",
                "--max-prepared", "2")


def start_controller(paths: SpoolPaths, index: int, *options: str) -> subprocess.Popen[bytes]:
    log = open(paths.root / f"adapt-{index}.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "adapt", str(paths.root),
         "--interval", "1", "--cooldown", "2", "--lease-timeout", "5", "--idle-exit", "4", "--time", "00:30:00",
         *(options or FULL_WORKERS)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


@pytest.mark.slurm(nodes=MAX)
def test_adapt_follows_the_queue_within_bounds_and_a_killed_controller_loses_nothing(
        run_root: Path, controllers: list[subprocess.Popen[bytes]]) -> None:
    paths = sleep_run(run_root, jobs=0, run_s=0)
    controllers += [start_controller(paths, 0), start_controller(paths, 1)]   # two at once: one acts
    watch = CountWatch(paths)

    # From 0 workers: --min brings up one kept worker, and nothing more without work.
    wait_until(lambda: [s for s, _ in adapt_tasks(paths).values()] == ["RUNNING"], 120, "the --min worker")
    assert state(paths)["target"] == MIN

    # Work arrives: workers grow to --max.
    tasks = write_jsonl(run_root.parent / "tasks.jsonl", [{"handler": "sleep", "instance": {"run": 1.0}}] * JOBS)
    cli("submit", str(paths.root), str(tasks))
    wait_until(lambda: [s for s, _ in adapt_tasks(paths).values()].count("RUNNING") == MAX, 120, f"{MAX} workers")
    assert state(paths)["target"] == MAX

    # Kill the controller that acts (no warning): the workers keep working, the other one takes over.
    holder = state(paths)["pid"]
    (victim,) = [p for p in controllers if p.pid == holder]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(30)
    exactly_once(wait_rows(paths, JOBS, timeout=240), JOBS)
    wait_until(lambda: state(paths).get("pid") not in (None, holder), 60, "the standby controller to take over")

    # Drained: the idle workers leave by themselves, down to the kept --min.
    wait_until(lambda: len(adapt_tasks(paths)) == MIN, 120, f"the workers to shrink to {MIN}")
    ((only_state, kept),) = adapt_tasks(paths).values()
    assert only_state == "RUNNING" and kept
    assert watch.stop() <= MAX, "two controllers together launched more than --max"
    wait_until(lambda: state(paths).get("target") == MIN, 30, "the target back at --min")
    decisions = state(paths)["decisions"]
    assert [d["action"] for d in decisions].count("grow") >= 2
    assert any(d["holder"] == state(paths)["holder"] for d in decisions), "the new holder records its decisions"

    # status shows the controller, its target and decisions.
    shown = cli("status", str(paths.root)).stdout
    assert "adapt all workers" in shown and f"target {MIN}" in shown and "grow" in shown


@pytest.mark.slurm(nodes=2)
def test_an_eval_controller_scales_eval_only_workers_with_the_eval_queue(
        run_root: Path, controllers: list[subprocess.Popen[bytes]], janitor: JobJanitor) -> None:
    paths = sleep_run(run_root, jobs=0, run_s=0)
    array, _ = launch(paths, "--nodes", "1", "--stages", "init,run", "--init-pool", "4", "--run-pool", "4")
    janitor.add(array)
    controllers.append(start_controller(paths, 0, "--stages", "eval", "--max", "2", "--eval-pool", "1",
                                        "--shared", "--cpus-per-node", "1"))
    jobs = 12   # EVAL takes 1 s, one slot per eval worker: the eval queue grows
    tasks = write_jsonl(run_root.parent / "tasks.jsonl", [{"handler": "sleep", "instance": {"run": 0.1, "eval": 1.0}}] * jobs)
    cli("submit", str(paths.root), str(tasks))
    watch = CountWatch(paths, "eval")
    table = wait_rows(paths, jobs, timeout=180)
    exactly_once(table, jobs)
    evaluators = {orjson.loads(p.read_bytes())["worker_id"] for p in [*paths.workers.glob("*.json"), *paths.workers.glob("gone/*.json")]
                  if orjson.loads(p.read_bytes()).get("launch_id", "").startswith("adapt-eval-")}
    assert evaluators and set(table["worker"]) <= evaluators, "every row is written by an eval worker adapt launched"
    assert [d["action"] for d in state(paths, "eval")["decisions"]].count("grow") >= 1
    wait_until(lambda: not adapt_tasks(paths, "eval"), 120, "the idle eval workers to leave")
    assert 1 <= watch.stop() <= 2

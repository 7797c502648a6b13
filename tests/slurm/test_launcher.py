"""Launch plumbing without a cluster: options, array splitting, dry run, local fallback, degradation."""

from __future__ import annotations

import json
import pickle
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.config import ConfigError
from orchestrator.slurm import cluster, launcher, queries
from orchestrator.slurm.errors import LaunchError, SlurmClientMissing, SlurmCommandFailed, SlurmUnavailable
from orchestrator.slurm.node_job import NodeWorker
from orchestrator.slurm.options import LaunchOptions, parse_sbatch_pairs
from orchestrator.slurm.timespec import parse_minutes
from orchestrator.worker.options import WorkerOptions
from tests.core.util import make_run, wait_until, write_jsonl


@pytest.mark.parametrize("text,minutes", [("30", 30), ("04:00:00", 240), ("1:30", 2), ("2-00", 2880),
                                          ("1-02:03", 1563), ("1-00:00:01", 1441)])
def test_slurm_time_formats(text: str, minutes: int) -> None:
    assert parse_minutes(text) == minutes


def test_bad_time_names_the_formats() -> None:
    with pytest.raises(ValueError, match="HH:MM:SS"):
        parse_minutes("4h")


def test_arrays_are_split_below_max_array_size() -> None:
    assert launcher.chunks(2500, 1001) == [(0, 834), (834, 833), (1667, 833)]
    assert launcher.chunks(9, 8) == [(0, 5), (5, 4)]          # even: no lone task
    assert launcher.chunks(16, 8) == [(0, 8), (8, 8)]
    assert launcher.chunks(4, 1001) == [(0, 4)]
    assert launcher.chunks(0, 8) == []


def test_sbatch_pairs_and_reserved_keys() -> None:
    assert parse_sbatch_pairs(["constraint=a100", "--hint=nomultithread", "exclusive"]) == (
        ("constraint", "a100"), ("hint", "nomultithread"), ("exclusive", ""))
    with pytest.raises(LaunchError, match="reserved"):
        parse_sbatch_pairs(["array=0-3"])
    with pytest.raises(LaunchError, match="USR1"):
        LaunchOptions(nodes=1, signal="KILL")
    with pytest.raises(LaunchError, match="--time"):
        LaunchOptions(nodes=1, time="soon")


def test_node_worker_pickles_without_its_thread() -> None:
    worker = NodeWorker("/spool/run", WorkerOptions(launch_id="L"), 7)
    copy = pickle.loads(pickle.dumps(worker))
    assert (copy.run_dir, copy.task_index, copy.options.launch_id) == ("/spool/run", 7, "L")


def test_dry_run_writes_the_batch_script(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    result = CliRunner().invoke(cli, [
        "launch", str(paths.root), "--nodes", "3", "--partition", "debug", "--time", "02:00:00",
        "--signal", "USR1", "--signal-delay", "60", "--setup", "module load x", "--sbatch", "constraint=a100",
        "--stages", "eval", "--dry-run"])
    assert result.exit_code == 0, result.output
    script = Path(result.output.split("batch script(s):")[1].split()[0])
    lines = script.read_text().splitlines()
    for line in ("#SBATCH --array=0-2%3", "#SBATCH --partition=debug", "#SBATCH --time=120",
                 "#SBATCH --signal=USR1@60", "#SBATCH --requeue", "#SBATCH --exclusive",
                 "#SBATCH --constraint=a100", "#SBATCH --open-mode=append", "module load x",
                 "export SUBMITIT_PREEMPT_SIGNAL=USR1"):
        assert line in lines, line
    record = json.loads((script.parent / "slurm.json").read_text())
    assert record["dry_run"] and record["arrays"][0]["size"] == 3
    assert not list(script.parent.glob("*.pkl")), "a dry run submits nothing"


def test_dry_run_splits_large_arrays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = make_run(tmp_path / "run")
    monkeypatch.setattr(launcher, "max_array_size", lambda: 3)
    result = launcher.launch(paths.root, LaunchOptions(nodes=7), WorkerOptions(), dry_run=True)
    assert [(a.first_index, a.size) for a in result.arrays] == [(0, 3), (3, 2), (5, 2)]
    assert "#SBATCH --array=0-2%3" in result.arrays[0].script.read_text()


def test_without_slurm_launch_runs_the_workers_locally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import slurm_launch

    paths = make_run(tmp_path / "run")
    write_jsonl(tmp_path / "tasks.jsonl", [{"handler": "sleep", "instance": {"run": 0.05}}] * 4)
    runner = CliRunner()
    assert runner.invoke(cli, ["submit", str(paths.root), str(tmp_path / "tasks.jsonl")]).exit_code == 0
    monkeypatch.setattr(slurm_launch, "slurm_available", lambda: False)
    result = runner.invoke(cli, ["launch", str(paths.root), "--nodes", "2", "--wait"])
    assert result.exit_code == 0, result.output
    assert "no Slurm on this machine" in result.output and "local worker" in result.output
    assert "drained" in result.output


def test_launch_without_slurm_or_run_dir_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "slurm_available", lambda: False)
    paths = make_run(tmp_path / "run")
    with pytest.raises(SlurmUnavailable, match="launch --local"):
        launcher.launch(paths.root, LaunchOptions(nodes=1), WorkerOptions())
    with pytest.raises(ConfigError, match="not a run directory .*hpc-rollout init"):   # the one answer (RunConfig.load)
        launcher.launch(tmp_path / "nothing", LaunchOptions(nodes=1), WorkerOptions(), dry_run=True)


def test_queries_degrade_without_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None)
    worker = {"alive": True, "worker_id": "w", "node": "n1", "slurm_array_job_id": "5", "slurm_array_task_id": "0"}
    assert queries.slurm_warnings([worker]) == []
    assert queries.accounted_states(["5"]) == {}
    assert queries.still_queued(["5"]) == []



def test_slurm_failures_are_told_apart_by_type_not_by_message(monkeypatch: pytest.MonkeyPatch) -> None:
    if not cluster.slurm_available():
        pytest.skip("needs the Slurm client commands (scripts/slurm-up.sh)")
    # Ids that left the queue long ago (or never existed): squeue exits 1, which means "none queued".
    assert queries.queued_tasks(["99999998", "99999999"]) == {}
    with pytest.raises(SlurmCommandFailed) as failed:
        cluster.run_slurm(["squeue", "-h", "--bogus-option"])
    assert failed.value.returncode != 0 and failed.value.command[:2] == ["squeue", "-h"]
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None)
    with pytest.raises(SlurmClientMissing):
        cluster.run_slurm(["squeue"])
    with pytest.raises(SlurmClientMissing):
        queries.cancel(["5"])

def test_task_of_a_worker() -> None:
    assert queries.task_of({"slurm_array_job_id": "12", "slurm_array_task_id": "3", "slurm_job_id": "15"}) == "12_3"
    assert queries.task_of({"slurm_job_id": "15"}) == "15"
    assert queries.task_of({}) is None


def test_a_task_starting_after_stop_does_not_serve(tmp_path: Path) -> None:
    import time

    from orchestrator.spool.launches import request_stop

    paths = make_run(tmp_path / "run")
    worker = NodeWorker(str(paths.root), WorkerOptions(), 0, submitted_at=time.time() - 60)
    request_stop(paths)
    assert worker.stop_requested() and worker() == 0
    assert not list(paths.workers.glob("*.json")), "no worker started"
    later = NodeWorker(str(paths.root), WorkerOptions(), 0, submitted_at=time.time() + 1)
    assert not later.stop_requested()


def test_a_rendered_script_s_task_counts_from_its_array_s_first_start(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A task of `sbatch render worker` has no launch time (Slurm resets SubmitTime at a requeue):
    the first task of its array to start records the time, later ones (requeued, throttled) read it."""
    import time

    from orchestrator.spool.launches import request_stop

    paths = make_run(tmp_path / "run")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "777")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    assert not NodeWorker(str(paths.root), WorkerOptions(), 0).stop_requested()   # the first start: recorded
    assert (paths.control / "array-777.started").is_file()
    time.sleep(0.01)
    request_stop(paths)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert NodeWorker(str(paths.root), WorkerOptions(), 1).stop_requested(), "a later task of the same array"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "778")
    time.sleep(0.01)
    assert not NodeWorker(str(paths.root), WorkerOptions(), 0).stop_requested(), "an array first started after the stop"


def test_stop_cancel_finds_a_rendered_scripts_array_after_its_workers_left(tmp_path: Path) -> None:
    """An array submitted with `sbatch` by hand has no launch record; once its workers stopped
    cleanly their heartbeats are gone too, but a task can still sit in squeue (COMPLETING, or
    requeued): `stop --cancel` must still know the array, from the mark its first task left."""
    from orchestrator.cli.slurm_launch import run_job_ids
    from orchestrator.spool.launches import array_started_at

    paths = make_run(tmp_path / "run")
    array_started_at(paths, "1244")
    assert not list(paths.workers.glob("*.json"))
    assert run_job_ids(paths) == ["1244"]


@pytest.mark.parametrize("warning", ["USR2", "USR1"])
def test_a_warning_that_comes_while_the_task_still_starts_waits_for_the_node_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warning: str) -> None:
    """Slurm may send the warning up to 60 s early (sbatch(1), --signal): on a short limit it can
    come while the task's Python still unpickles the node worker, before submitit or NodeWorker
    listen. The task must not die of it: the signal is kept for NodeWorker to act on."""
    options = LaunchOptions(nodes=1, signal=warning)
    script = launcher.render_script(tmp_path, options, 1)
    srun_line = next(line for line in script.splitlines() if "submitit.core._submit" in line)
    task_command = srun_line[srun_line.index(launcher.task_python(options)):]
    # The task's exact command, with a probe in place of submitit's module (no Slurm here).
    running = tmp_path / "running"
    argv = shlex.split(task_command.replace("submitit.core._submit", "tests.slurm.early_warning_probe"))
    argv[-1] = str(running)
    if warning != "USR2":
        monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", warning)   # what the script's setup exports
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))
    probe = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: running.exists() or probe.poll() is not None, 30, "the probe to start")
        probe.send_signal(signal.Signals["SIG" + warning])
        out, _ = probe.communicate(timeout=30)
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    assert probe.returncode == 0, f"the task's Python died of SIG{warning} (status {probe.returncode})"
    assert out.split() == [str(int(signal.Signals["SIG" + warning]))]

"""Submit node workers as Slurm job arrays through submitit (or write the script: dry run).

One launch = one array of N tasks, each task a NodeWorker on one node. Arrays longer than the
site's MaxArraySize are split (each task carries its global index). Nothing here waits for a
job: submitit's result() can hang forever without accounting; the spool's heartbeats tell who
is alive.
"""

from __future__ import annotations

import os
import shlex
import site
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

import orchestrator
from orchestrator.config import RunConfig
from orchestrator.spool import fsops
from orchestrator.spool.launches import launch_log_dir, new_launch_id
from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.cluster import max_array_size, slurm_available
from orchestrator.slurm.errors import LaunchError, SlurmUnavailable
from orchestrator.slurm.options import LaunchOptions
from orchestrator.worker.options import WorkerOptions

# submitit and the node job (the whole worker engine, aiohttp, pyarrow) load only where an array
# is submitted or its script written: `status` and `stop` read this module's launch records.
if TYPE_CHECKING:
    from orchestrator.slurm.submitit_adapter import SlurmExecutor

RECORD_NAME = "slurm.json"      # in logs/LAUNCH/: the arrays of this launch (for stop --cancel)
TAIL_TASKS_SHOWN = 4


@dataclass(frozen=True)
class ArraySubmission:
    job_id: str           # the array's job id ("" for a dry run)
    first_index: int      # global index of this array's task 0
    size: int
    script: Path          # the batch script sbatch received (or would receive)


@dataclass(frozen=True)
class LaunchResult:
    launch_id: str
    log_dir: Path
    arrays: tuple[ArraySubmission, ...]
    dry_run: bool = False

    @property
    def array_ids(self) -> list[str]:
        return [a.job_id for a in self.arrays if a.job_id]

    def task_logs(self) -> list[Path]:
        """stdout of every task, named as submitit names them (%A_%a_0_log.out, %j_0_log.out alone)."""
        logs = []
        for array in self.arrays:
            if array.size == 1:
                logs.append(self.log_dir / f"{array.job_id}_0_log.out")
            else:
                logs += [self.log_dir / f"{array.job_id}_{i}_0_log.out" for i in range(array.size)]
        return logs

    def tail_hints(self) -> list[str]:
        logs = self.task_logs()
        hints = [f"tail -F {shlex.quote(str(p))}" for p in logs[:TAIL_TASKS_SHOWN]]
        if len(logs) > TAIL_TASKS_SHOWN:
            hints.append(f"tail -F {shlex.quote(str(self.log_dir))}/*_log.out   # all {len(logs)} tasks")
        return hints


def _needs_pythonpath() -> Path | None:
    """The source tree to put on PYTHONPATH when this package is not installed in site-packages."""
    root = Path(orchestrator.__file__).resolve().parent.parent
    installed = [Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]]
    return None if root in installed else root


def setup_lines(options: LaunchOptions) -> list[str]:
    lines = []
    source = _needs_pythonpath()
    if source is not None and options.python is None:
        lines.append(f"export PYTHONPATH={shlex.quote(str(source))}${{PYTHONPATH:+:$PYTHONPATH}}")
    if options.signal != "USR2":
        # submitit's job side listens for it until NodeWorker takes the signals over (node_job.py).
        lines.append(f"export SUBMITIT_PREEMPT_SIGNAL={options.signal}")
    for key, value in options.extra_env:
        lines.append(f"export {key}={shlex.quote(value)}")
    return lines + list(options.setup)


def executor_parameters(options: LaunchOptions, size: int) -> dict[str, Any]:
    additional: dict[str, Any] = {
        "requeue": True,
        # submitit's default is USR2@delay; this makes the signal a site choice.
        "signal": f"{options.signal}@{options.signal_delay_s}",
    }
    if options.mem:
        additional["mem"] = options.mem
    for key, value in options.sbatch:
        additional[key] = value if value else True
    params: dict[str, Any] = {
        "job_name": options.job_name,
        "time": options.time_min,
        "nodes": 1,
        "ntasks_per_node": 1,
        "signal_delay_s": options.signal_delay_s,
        "array_parallelism": min(options.array_parallelism or size, size),
        "setup": setup_lines(options),
        "additional_parameters": additional,
        "wckey": None,   # submitit sets "submitit"; leave the site default
    }
    for key in ("partition", "account", "qos"):
        if getattr(options, key):
            params[key] = getattr(options, key)
    if options.cpus_per_node:
        params["cpus_per_task"] = options.cpus_per_node
    if options.gpus_per_node:
        params["gpus_per_node"] = options.gpus_per_node
    if options.exclusive:
        params["exclusive"] = True
    return params


def task_python(options: LaunchOptions) -> str:
    """What each task runs `-u -m submitit.core._submit FOLDER` with: Python entered through
    submitit_task, which keeps a warning signal that comes while the task still starts."""
    return f"{options.python or shlex.quote(sys.executable)} -u -m orchestrator.slurm.submitit_task"


def _executor(log_dir: Path, options: LaunchOptions, size: int, offline: bool) -> SlurmExecutor:
    from orchestrator.slurm.submitit_adapter import OfflineExecutor, SlurmExecutor

    cls = OfflineExecutor if offline else SlurmExecutor
    executor = cls(folder=log_dir, max_num_timeout=options.max_requeues, python=task_python(options))
    executor.update_parameters(**executor_parameters(options, size))
    return executor


def chunks(total: int, limit: int) -> list[tuple[int, int]]:
    """(first global index, size) of each array: indices 0..MaxArraySize-1 are valid.

    The arrays are as even as possible (9 under a limit of 8: 5 + 4, not 8 + 1): submitit
    submits a lone task as a plain job, and equal arrays behave alike in the queue.
    """
    count = -(-total // max(1, limit))
    base, extra = divmod(total, count) if count else (0, 0)
    result, start = [], 0
    for index in range(count):
        size = base + (1 if index < extra else 0)
        result.append((start, size))
        start += size
    return result


def render_script(log_dir: Path, options: LaunchOptions, size: int) -> str:
    """The batch script of one array of `size` tasks, exactly as submitit would submit it."""
    from orchestrator.slurm.submitit_adapter import submission_script

    executor = _executor(log_dir, options, size, offline=True)
    if size > 1:
        executor.parameters["map_count"] = size
    return submission_script(executor)


def launch(run_dir: str | os.PathLike[str], options: LaunchOptions, worker: WorkerOptions,
           dry_run: bool = False) -> LaunchResult:
    """Submit `options.nodes` node workers on the run (or only write their scripts with dry_run)."""
    from orchestrator.slurm.node_job import NodeWorker
    from orchestrator.slurm.submitit_adapter import FailedJobError, FailedSubmissionError

    paths = SpoolPaths.of(run_dir)
    RunConfig.load(paths.run_config)   # a run directory, with settings a worker can start from
    if not dry_run and not slurm_available():
        raise SlurmUnavailable("no Slurm here (sbatch/srun/squeue not on PATH): use launch --local")
    launch_id = worker.launch_id or new_launch_id("dryrun" if dry_run else "slurm")
    worker = replace(worker, launch_id=launch_id)
    log_dir = launch_log_dir(paths, launch_id)
    arrays: list[ArraySubmission] = []
    for first, size in chunks(options.nodes, max_array_size()):
        if dry_run:
            script = log_dir / f"array-{first}.sbatch"
            script.write_text(render_script(log_dir, options, size), encoding="utf-8")
            arrays.append(ArraySubmission("", first, size, script))
            continue
        executor = _executor(log_dir, options, size, offline=False)
        submitted_at = time.time()
        workers = [NodeWorker(str(paths.root), worker, first + i, submitted_at, options.signal) for i in range(size)]
        try:
            jobs = executor.submit_array(workers)
        except (FailedJobError, FailedSubmissionError, OSError) as exc:
            raise LaunchError(f"sbatch refused the array: {exc}") from exc
        array_id = str(jobs[0].job_id).split("_", 1)[0]
        arrays.append(ArraySubmission(array_id, first, size, jobs[0].paths.submission_file))
    result = LaunchResult(launch_id, log_dir, tuple(arrays), dry_run)
    _record(result, options)
    return result


def _record(result: LaunchResult, options: LaunchOptions) -> None:
    record = {
        "launch_id": result.launch_id, "dry_run": result.dry_run, "submitted_at": time.time(),
        "nodes": options.nodes, "partition": options.partition,
        "arrays": [{"job_id": a.job_id, "first_index": a.first_index, "size": a.size, "script": str(a.script)}
                   for a in result.arrays],
        "argv": sys.argv,
    }
    (result.log_dir / RECORD_NAME).write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))


def launched_arrays(paths: SpoolPaths) -> list[str]:
    """Array ids of every Slurm launch recorded in the run's logs/ (for stop --cancel)."""
    ids: list[str] = []
    if not paths.logs.is_dir():
        return ids
    for record in sorted(paths.logs.glob(f"*/{RECORD_NAME}")):
        try:
            data = orjson.loads(fsops.read_bytes(record))
        except (OSError, orjson.JSONDecodeError):
            continue
        ids += [a["job_id"] for a in data.get("arrays", []) if a.get("job_id")]
    return ids

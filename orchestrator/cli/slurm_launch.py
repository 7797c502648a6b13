"""The Slurm half of `launch` and `stop --cancel`: option plumbing and what to print."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import click
import orjson

from orchestrator.app.signal_relay import SignalRelay
from orchestrator.cli.console import Tone, detach_from_a_lost_terminal, err, say, styled, tell
from orchestrator.cli.exit_codes import ExitCode
from orchestrator.cli.progress import progress_until_drained, report_backends_once, report_drained
from orchestrator.config import RunConfig
from orchestrator.spool.liveness import read_workers
from orchestrator.spool.launches import request_stop, started_arrays
from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.cluster import slurm_available
from orchestrator.slurm.errors import SlurmError
from orchestrator.slurm.launcher import LaunchResult, launch, launched_arrays
from orchestrator.slurm.options import LaunchOptions, parse_sbatch_pairs
from orchestrator.slurm.queries import cancel, still_queued
from orchestrator.worker.options import WorkerOptions

if TYPE_CHECKING:
    from orchestrator.report.job_progress import JobProgress

CANCEL_WAIT_S = 30.0   # KillWait + epilog of the tasks still running
EXIT_WAIT_S = 15.0     # drained workers' tasks leave squeue by themselves (COMPLETED) this fast


def sbatch_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """What `launch --nodes` asks Slurm for, shared with `adapt`."""
    for option in reversed([
        click.option("--partition", help="Slurm partition (default: the site's)."),
        click.option("--time", "time_limit", default="01:00:00", show_default=True, help="Slurm time limit per task; at the limit a task requeues itself."),
        click.option("--account", help="Slurm account to charge."),
        click.option("--qos", help="Slurm quality of service."),
        click.option("--cpus-per-node", type=click.IntRange(1), help="CPUs per task (default: the whole node with --exclusive)."),
        click.option("--mem", help="Memory per node, e.g. 64G."),
        click.option("--gpus-per-node", type=click.IntRange(0), help="GPUs per task."),
        click.option("--array-parallelism", type=click.IntRange(1), help="At most this many tasks run at once (%K)."),
        click.option("--exclusive/--shared", default=True, show_default=True, help="Whole nodes (one worker per node) or shared ones."),
        click.option("--setup", multiple=True, metavar="CMD", help="Shell line run before the worker (repeatable): module load, source venv..."),
        click.option("--sbatch", "sbatch_pairs", multiple=True, metavar="KEY=VALUE", help="Any other sbatch option (repeatable), e.g. constraint=a100."),
        click.option("--python", "python_cmd", help="Command that runs Python in the job, e.g. 'apptainer exec img.sif python'."),
        click.option("--signal", "warn_signal", default="USR2", show_default=True, help="Warning signal before preemption/time limit (sites differ)."),
        click.option("--signal-delay", type=click.IntRange(1), default=90, show_default=True, help="Seconds between the warning signal and the kill."),
    ]):
        command = option(command)
    return command


def slurm_launch_options(nodes: int, partition: str | None, time_limit: str, account: str | None,
                         qos: str | None, cpus_per_node: int | None, mem: str | None,
                         gpus_per_node: int | None, array_parallelism: int | None, exclusive: bool,
                         setup: tuple[str, ...], sbatch_pairs: tuple[str, ...], python_cmd: str | None,
                         warn_signal: str, signal_delay: int) -> LaunchOptions:
    try:
        return LaunchOptions(
            nodes=nodes, partition=partition, time=time_limit, account=account, qos=qos,
            cpus_per_node=cpus_per_node, mem=mem, gpus_per_node=gpus_per_node,
            array_parallelism=array_parallelism, exclusive=exclusive, setup=tuple(setup),
            sbatch=parse_sbatch_pairs(sbatch_pairs), python=python_cmd, signal=warn_signal,
            signal_delay_s=signal_delay,
        )
    except SlurmError as exc:
        raise click.UsageError(str(exc)) from None


def launch_on_slurm(run_dir: str, options: LaunchOptions, worker: WorkerOptions, dry_run: bool) -> LaunchResult | None:
    """Submit (or dry-run) the array; None when there is no Slurm here (caller runs locally)."""
    if not dry_run and not slurm_available():
        tell(f"no Slurm on this machine (sbatch/srun/squeue not on PATH): running {options.nodes} "
             f"local worker(s) instead, as `launch --local --workers {options.nodes}` would")
        return None
    try:
        return launch(run_dir, options, worker, dry_run=dry_run)
    except SlurmError as exc:
        raise click.ClickException(str(exc)) from None


def slurm_launch_json(result: LaunchResult) -> dict[str, Any]:
    """What `launch --nodes N --json` prints."""
    return {"launch_id": result.launch_id, "where": "slurm", "log_dir": str(result.log_dir),
            "arrays": [{"job_id": a.job_id, "size": a.size, "first_index": a.first_index, "script": str(a.script)}
                       for a in result.arrays],
            "ends": "they run until `hpc-rollout stop RUN_DIR [--cancel]`, the time limit, or --idle-exit"}


def describe_slurm_launch(run_dir: str, result: LaunchResult, options: LaunchOptions, dry_run: bool,
                          wait: bool = False) -> None:
    if dry_run:
        say(f"dry run {result.launch_id}: nothing submitted; batch script(s):")
        for array in result.arrays:
            say(f"  {array.script}   # {array.size} task(s), global index {array.first_index}+")
        return
    arrays = ", ".join(f"{a.job_id} ({a.size} task{'s' if a.size > 1 else ''})" for a in result.arrays)
    say(f"launch {result.launch_id}: Slurm array {arrays}"
        f"{f' on partition {options.partition}' if options.partition else ''}")
    say(f"  logs: {result.log_dir}")
    for hint in result.tail_hints():
        say(f"  {hint}")
    say(f"  watch: hpc-rollout status {run_dir}    squeue -r -j {','.join(result.array_ids)}")
    if wait:
        say("  they stop when the queues drain (Ctrl-C drains them now, a second one ends the arrays)")
    else:
        say(f"  stop:  hpc-rollout stop {run_dir} [--cancel]   (else the workers run until the time limit, or --idle-exit)")


def wait_and_stop_slurm(paths: SpoolPaths, result: LaunchResult, config: RunConfig, as_json: bool = False,
                        poll_s: float = 1.0, jobs: "JobProgress | None" = None) -> None:
    """`launch --nodes N --wait`: progress until no job is pending, then drain and end the arrays.

    Liveness comes from the spool; squeue only tells whether the arrays still exist at all. A
    first Ctrl-C/SIGTERM/SIGHUP drains every worker (control/stop), a second scancels the arrays.
    """
    def end_arrays_now() -> None:
        cancel(result.array_ids)

    relay = SignalRelay(drain=lambda: request_stop(paths), stop_now=end_arrays_now, on_hangup=detach_from_a_lost_terminal)
    with relay:
        report_backends_once(paths, config)
        drain = progress_until_drained(paths, err, lambda: bool(still_queued(result.array_ids)), poll_s, relay, config,
                                       jobs)
        request_stop(paths)
        cancel(result.array_ids, pending_only=True)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while still_queued(result.array_ids) and time.monotonic() < deadline:
            time.sleep(0.5)
        if still_queued(result.array_ids):
            cancel(result.array_ids)
    ended = f"arrays {' '.join(result.array_ids)} ended"
    if as_json:
        code = ExitCode.INTERRUPTED if relay.interrupted else drain.exit_code
        click.echo(orjson.dumps({"drained": drain.drained, "by_status": dict(drain.tally.by_status),
                                 "retried": drain.tally.retried, "interrupted_by": relay.received,
                                 "exit_code": int(code)}).decode())
    if relay.interrupted:
        tell(styled(f"interrupted ({', '.join(relay.received)})", Tone.WARNING),
             f": {drain.tally.summary()}; {ended}, unfinished jobs are back in the queues")
        sys.exit(ExitCode.INTERRUPTED)
    if not drain.drained:
        tell(styled("the arrays ended before the queues drained", Tone.ERROR), f"; see {result.log_dir}")
        sys.exit(ExitCode.FAILED)
    report_drained(drain, ended, str(paths.root), json_on_stdout=as_json)


def run_job_ids(paths: SpoolPaths) -> list[str]:
    """Every Slurm job/array this run launched: launch records, the start marks of hand-submitted
    arrays (`sbatch render worker`), and worker heartbeats."""
    ids = set(launched_arrays(paths)) | set(started_arrays(paths))
    for record in read_workers(paths, lease_s=float("inf")):
        info = record.info
        ids.add(str(info.get("slurm_array_job_id") or info.get("slurm_job_id") or ""))
    ids.discard("")
    return sorted(ids)


def _any_alive(paths: SpoolPaths, lease_s: float) -> bool:
    return any(r.alive for r in read_workers(paths, lease_s=lease_s) if r.info.get("state") != "stopped")


def cancel_run_arrays(paths: SpoolPaths, pending_only: bool) -> list[str]:
    """scancel the run's arrays; returns tasks still in squeue after waiting (empty = all gone)."""
    if not slurm_available():
        return []
    ids = run_job_ids(paths)
    queued = still_queued(ids)
    if not queued:
        return []
    if pending_only:
        cancel(ids, pending_only=True)
        return []
    lease_s = RunConfig.load(paths.run_config).leases.lease_s
    deadline = time.monotonic() + EXIT_WAIT_S
    while queued and time.monotonic() < deadline and not _any_alive(paths, lease_s):
        time.sleep(0.5)
        queued = still_queued(ids)
    if not queued:
        return []
    cancel(ids)
    say(f"scancel {' '.join(ids)}")
    deadline = time.monotonic() + CANCEL_WAIT_S
    while queued and time.monotonic() < deadline:
        time.sleep(0.5)
        queued = still_queued(ids)
    return queued

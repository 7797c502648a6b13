"""`launch` and `stop`: start stage workers on a run, drain them."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import click
from rich.console import Console

from orchestrator.config import ConfigError
from orchestrator.spool.liveness import read_workers
from orchestrator.cli.progress import drain_with_progress, report_drained
from orchestrator.app.local_launch import LocalLaunch, start_local_workers
from orchestrator.spool.launches import request_stop
from orchestrator.spool.paths import SpoolPaths
from orchestrator.config import RUNTIME_NAMES
from orchestrator.spool.rundir import open_run
from orchestrator.worker.options import OptionsError, WorkerOptions, parse_stages, pool_verdict
from orchestrator.cli.slurm_launch import cancel_run_arrays, launch_on_slurm, sbatch_flags, slurm_launch_options, wait_and_stop_slurm

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def worker_options(stages: str, init_pool: int | None, run_pool: int | None, eval_pool: int | None,
                   max_prepared: int | None, runtime: str | None, idle_exit_s: float | None = None) -> WorkerOptions:
    try:
        return WorkerOptions(stages=parse_stages(stages), init_pool=init_pool, run_pool=run_pool,
                             eval_pool=eval_pool, max_prepared=max_prepared, runtime=runtime,
                             idle_exit_s=idle_exit_s)
    except OptionsError as exc:
        raise click.BadParameter(str(exc), param_hint="--stages") from None


def judge_pools(options: WorkerOptions) -> None:
    """Refuse pools that can never finish a job (a one-line error); warn when others must run too."""
    verdict = pool_verdict(options)
    if verdict.refusal:
        raise click.ClickException(verdict.refusal)
    if verdict.warning:
        err.print(f"[yellow]warning:[/yellow] {verdict.warning}")


def worker_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """The worker options of `launch`, shared with `adapt`."""
    for option in reversed([
        click.option("--stages", default="all", show_default=True, help="Stages the workers run: init,run,eval or a subset."),
        click.option("--init-pool", type=click.IntRange(0), help="INIT slots per worker (default: run.toml [pools])."),
        click.option("--run-pool", type=click.IntRange(0), help="RUN slots per worker."),
        click.option("--eval-pool", type=click.IntRange(0), help="EVAL slots per worker."),
        click.option("--max-prepared", type=click.IntRange(0), help="INIT pauses while the node's run queue holds this many."),
        click.option("--runtime", type=click.Choice(RUNTIME_NAMES), help="Sandbox runtime (default: run.toml)."),
        click.option("--idle-exit", "idle_exit_s", type=click.FloatRange(0), metavar="SECONDS",
                     help="A worker with nothing to claim and nothing in flight this long exits 0 and gives its node back (0: never; default: run.toml [workers])."),
    ]):
        command = option(command)
    return command


@click.command("launch")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--local", "local", is_flag=True, help="Run the workers as processes on this machine.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 512), help="Worker processes (--local).")
@click.option("--wait", is_flag=True, help="Show progress until every queued job is finished, then stop the workers "
              "(and end the arrays). Exit status: 0 all ok, 3 some jobs failed or timed out, 1 workers ended first.")
@worker_flags
@click.option("--nodes", type=click.IntRange(1), help="Slurm: one job array of NODES tasks, a node worker each.")
@sbatch_flags
@click.option("--dry-run", is_flag=True, help="Write the batch script(s) under RUN_DIR/logs/ without submitting.")
def launch_cmd(run_dir: str, local: bool, workers: int, wait: bool, stages: str, init_pool: int | None,
               run_pool: int | None, eval_pool: int | None, max_prepared: int | None, runtime: str | None,
               idle_exit_s: float | None, nodes: int | None, partition: str | None, time_limit: str, account: str | None, qos: str | None,
               cpus_per_node: int | None, mem: str | None, gpus_per_node: int | None, array_parallelism: int | None,
               exclusive: bool, setup: tuple[str, ...], sbatch_pairs: tuple[str, ...], python_cmd: str | None,
               warn_signal: str, signal_delay: int, dry_run: bool) -> None:
    """Start stage workers on RUN_DIR: a Slurm job array (--nodes N) or local processes (--local).

    \b
    hpc-rollout launch spool/run1 --nodes 8 --partition batch --time 04:00:00 --account myproj
    hpc-rollout launch spool/run1 --nodes 4 --stages eval --partition cpu     # eval-only workers
    hpc-rollout launch spool/demo --local --workers 2 --wait
    hpc-rollout launch spool/run1 --nodes 8 --idle-exit 300   # each worker leaves after 5 idle minutes
    Without Slurm on this machine, --nodes N runs N local workers instead (and says so).
    `hpc-rollout status RUN_DIR` shows the workers, `hpc-rollout stop RUN_DIR [--cancel]` drains them.
    """
    paths, config = _open(run_dir)
    options = worker_options(stages, init_pool, run_pool, eval_pool, max_prepared, runtime, idle_exit_s)
    judge_pools(options.resolve(config))
    if (runtime or config.sandbox.runtime) == "apptainer" and nodes is None:
        from orchestrator.sandbox.apptainer import require_apptainer

        require_apptainer()  # a one-line error here, not one failed job per task later
    if runtime == "local":
        err.print("[yellow]warning:[/yellow] --runtime local runs agents WITHOUT isolation (development only)")
    if nodes is not None and local:
        raise click.UsageError("--nodes is for Slurm and --local for this machine: choose one (--local --workers N)")
    if nodes is not None:
        slurm = slurm_launch_options(nodes, partition, time_limit, account, qos, cpus_per_node, mem, gpus_per_node,
                                     array_parallelism, exclusive, setup, sbatch_pairs, python_cmd, warn_signal,
                                     signal_delay)
        result = launch_on_slurm(run_dir, slurm, options, dry_run, out, err)
        if result is not None:
            if wait and not dry_run:
                wait_and_stop_slurm(paths, result, out, err)
            return
        workers = nodes  # no Slurm here: the same workers, locally
    elif dry_run:
        raise click.UsageError("--dry-run writes a Slurm batch script: give --nodes N")
    launch = start_local_workers(paths, workers, options)
    out.print(f"launch {launch.launch_id}: {workers} local worker(s), pids {' '.join(map(str, launch.pids))}")
    out.print(f"  logs: {launch.log_dir}")
    out.print(f"  tail -F {launch.log_dir}/worker-*.log")
    if not wait:
        out.print(f"  stop them with: hpc-rollout stop {run_dir}")
        return
    _wait_and_stop(paths, launch, config.shutdown.grace_s, run_dir)


def _wait_and_stop(paths: SpoolPaths, launch: LocalLaunch, grace_s: float, run_dir: str) -> None:
    result = None
    try:
        result = drain_with_progress(paths, launch, err)
    except KeyboardInterrupt:
        err.print("interrupted: stopping the workers (they return unfinished jobs to the queues)")
    codes = launch.terminate(timeout_s=grace_s + 10)
    if result is None or not result.drained:
        err.print(f"[red]workers ended before the queues drained[/red] (exit codes {codes}); see {launch.log_dir}")
        sys.exit(1)
    report_drained(result, f"workers stopped (exit codes {codes})", run_dir)


@click.command("stop")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--no-wait", is_flag=True, help="Return at once instead of waiting for the workers to exit.")
@click.option("--timeout", default=None, type=click.FloatRange(0), help="Seconds to wait (default: grace period + lease).")
@click.option("--cancel", is_flag=True, help="Also scancel the run's Slurm arrays (pending tasks at once, the rest after the drain).")
def stop_cmd(run_dir: str, no_wait: bool, timeout: float | None, cancel: bool) -> None:
    """Drain every worker of RUN_DIR: stop claiming, finish or return running jobs, exit."""
    paths, config = _open(run_dir)
    request_stop(paths)
    if cancel:
        cancel_run_arrays(paths, pending_only=True, out=out)  # tasks not started yet would start later
    alive = [w for w in read_workers(paths, config.leases.lease_s) if w.alive]
    out.print(f"stop requested ({paths.stop_request}); {len(alive)} worker(s) alive")
    if no_wait and not cancel:
        return
    deadline = time.monotonic() + (timeout if timeout is not None else config.shutdown.grace_s + config.leases.lease_s)
    while alive and time.monotonic() < deadline and not no_wait:
        time.sleep(0.5)
        alive = [w for w in read_workers(paths, config.leases.lease_s) if w.alive]
    if cancel:
        remaining = cancel_run_arrays(paths, pending_only=False, out=out)
        if remaining:
            err.print(f"[yellow]still in squeue:[/yellow] {' '.join(remaining)}")
            sys.exit(1)
    if alive and not no_wait:
        err.print(f"[yellow]{len(alive)} worker(s) still alive:[/yellow] {', '.join(w.worker_id for w in alive)}")
        sys.exit(1)
    out.print("all workers stopped")


def _open(run_dir: str):  # type: ignore[no-untyped-def]
    try:
        return open_run(run_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def register(cli: click.Group) -> None:
    cli.add_command(launch_cmd)
    cli.add_command(stop_cmd)

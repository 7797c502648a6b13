"""`launch` and `stop`: start stage workers on a run, drain them."""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, Callable

import click
import orjson

from orchestrator.app.local_launch import LocalLaunch, start_local_workers
from orchestrator.app.signal_relay import SignalRelay
from orchestrator.cli.console import Tone, detach_from_a_lost_terminal, say, styled, tell, warn
from orchestrator.cli.exit_codes import ExitCode
from orchestrator.cli.progress import (DrainResult, drain_with_progress, report_backends_once, report_drained,
                                       watch_jobs)
from orchestrator.cli.run_dir import RUN_DIR_TYPE
from orchestrator.cli.slurm_launch import (cancel_run_arrays, describe_slurm_launch, launch_on_slurm, sbatch_flags,
                                           slurm_launch_json, slurm_launch_options, wait_and_stop_slurm)
from orchestrator.config import ConfigError, RunConfig
from orchestrator.settings_click import click_decorators
from orchestrator.settings_spec import declarations
from orchestrator.spool.launches import request_stop
from orchestrator.spool.liveness import WorkerRecord, read_workers
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool import access
from orchestrator.spool.fs_record import check_lease
from orchestrator.spool.rundir import open_run
from orchestrator.worker.options import WorkerOptions, pool_verdict


def judge_pools(options: WorkerOptions) -> None:
    """Refuse pools that can never finish a job (a one-line error); warn when others must run too."""
    verdict = pool_verdict(options)
    if verdict.refusal:
        raise click.ClickException(verdict.refusal)
    if verdict.warning:
        warn(verdict.warning)


def worker_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """The worker options of `launch`, shared with `adapt`: generated from WorkerOptions's declarations
    (all but those the launcher sets itself), they reach the command as one `worker: WorkerOptions`."""
    @functools.wraps(command)
    def with_worker_options(**params: Any) -> Any:
        worker = WorkerOptions.from_params(params)
        return command(worker=worker, **{k: v for k, v in params.items() if k not in declarations(WorkerOptions)})

    for option in reversed(click_decorators(WorkerOptions, include_by_launcher=False)):
        with_worker_options = option(with_worker_options)
    return with_worker_options


@click.command("launch")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.option("--local", "local", is_flag=True, help="Run the workers as processes on this machine.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 512), help="Worker processes (--local).")
@click.option("--wait", is_flag=True, help="Show progress until every queued job is finished, then stop the workers "
              "(and end the arrays). Exit status: 0 all ok, 1 some failed (or the workers ended first), "
              "3 some cancelled, 130 interrupted.")
@click.option("--json", "as_json", is_flag=True, help="Print what was started as one JSON object (and, with --wait, "
              "how it ended as a second one) instead of text.")
@worker_flags
@click.option("--nodes", type=click.IntRange(1), help="Slurm: one job array of NODES tasks, a node worker each.")
@sbatch_flags
@click.option("--dry-run", is_flag=True, help="Write the batch script(s) under RUN_DIR/logs/ without submitting.")
def launch_cmd(run_dir: str, local: bool, workers: int, wait: bool, as_json: bool, worker: WorkerOptions,
               nodes: int | None, partition: str | None, time_limit: str, account: str | None, qos: str | None,
               cpus_per_node: int | None, mem: str | None, gpus_per_node: int | None, array_parallelism: int | None,
               exclusive: bool, setup: tuple[str, ...], sbatch_pairs: tuple[str, ...], python_cmd: str | None,
               warn_signal: str, signal_delay: int, dry_run: bool) -> None:
    """Start stage workers on RUN_DIR: a Slurm job array (--nodes N) or local processes (--local).

    \b
    Examples:
      hpc-rollout launch spool/demo --local --workers 2 --wait
      hpc-rollout launch spool/run1 --nodes 8 --partition batch --time 04:00:00 --account myproj
      hpc-rollout launch spool/run1 --nodes 4 --stages eval --partition cpu     # eval-only workers
      hpc-rollout launch spool/run1 --nodes 8 --idle-exit 300   # each worker leaves after 5 idle minutes
      hpc-rollout launch spool/demo --local --json | jq .pids
    Without Slurm on this machine, --nodes N runs N local workers instead (and says so).
    `hpc-rollout status RUN_DIR` shows the workers, `hpc-rollout stop RUN_DIR [--cancel]` drains them.

    \b
    How the workers end:
      --wait   when the queues drain (this command stops them); Ctrl-C, SIGTERM or SIGHUP
               drains them (a second one returns running jobs at once); should this command
               die outright, they leave once nothing is left to claim
      without  they run until `hpc-rollout stop RUN_DIR`, or --idle-exit SECONDS of nothing to do
    """
    paths, config = _open(run_dir)
    if dry_run:
        for directory, mode in access.loose_directories(access.working_directories(paths)):
            warn(f"would repair {directory}: mode {mode:04o} lets others place or swap files in it")
    else:
        for change in access.tighten(access.working_directories(paths)):   # before any worker reads a ticket
            warn(f"repaired {change}")
    check_lease(paths, config.leases)   # a lease shorter than the filesystem's measured delay fences healthy workers
    judge_pools(worker.resolve(config))
    if (worker.runtime or config.sandbox.runtime) == "apptainer" and nodes is None:
        from orchestrator.sandbox.apptainer import require_apptainer

        require_apptainer()  # a one-line error here, not one failed job per task later
    if worker.runtime == "local":
        warn("--runtime local runs agents WITHOUT isolation (development only)")
    if nodes is not None and local:
        raise click.UsageError("--nodes is for Slurm and --local for this machine: choose one (--local --workers N)")
    already = [w for w in read_workers(paths, config.leases.lease_s) if w.alive and w.info.get("state") != "stopped"]
    if nodes is not None:
        slurm = slurm_launch_options(nodes, partition, time_limit, account, qos, cpus_per_node, mem, gpus_per_node,
                                     array_parallelism, exclusive, setup, sbatch_pairs, python_cmd, warn_signal,
                                     signal_delay)
        jobs = watch_jobs(paths) if wait and not dry_run else None   # before the arrays start
        result = launch_on_slurm(run_dir, slurm, worker, dry_run)
        if result is not None:
            if as_json:
                click.echo(orjson.dumps({**slurm_launch_json(result), "dry_run": dry_run,
                                         "already_alive": _alive_json(already)}).decode())
            else:
                describe_slurm_launch(run_dir, result, slurm, dry_run, wait)
                _note_already_alive(already, nodes)
            if wait and not dry_run:
                wait_and_stop_slurm(paths, result, config, as_json, jobs=jobs)
            return
        workers = nodes  # no Slurm here: the same workers, locally
    elif dry_run:
        raise click.UsageError("--dry-run writes a Slurm batch script: give --nodes N")
    if not wait:
        launch = start_local_workers(paths, workers, worker)
        _describe_local(run_dir, launch, workers, already, as_json, ends=f"they run until `hpc-rollout stop {run_dir}`"
                        + (" or until idle for --idle-exit seconds" if worker.idle_exit_s else
                           " (or pass --idle-exit SECONDS to let them leave when idle)"))
        return
    _run_and_wait(paths, config, run_dir, workers, worker, already, as_json)


def _run_and_wait(paths: SpoolPaths, config: RunConfig, run_dir: str, workers: int, options: WorkerOptions,
                  already: list[WorkerRecord], as_json: bool) -> None:
    """Start local workers this command owns, show progress until drained, stop them; signals are
    passed on to them (orchestrator/app/signal_relay.py)."""
    owned: list[LocalLaunch] = []   # filled once started: a signal may come while they start

    def drain() -> None:
        for started in owned:
            started.drain()

    def stop_now() -> None:
        for started in owned:
            started.stop_now()

    relay = SignalRelay(drain=drain, stop_now=stop_now, on_hangup=detach_from_a_lost_terminal)
    with relay:
        jobs = watch_jobs(paths)
        launch = start_local_workers(paths, workers, options, owned=True)
        owned.append(launch)
        relay.replay()   # a signal that came while the workers were starting
        _describe_local(run_dir, launch, workers, already, as_json,
                        ends="they stop when the queues drain (Ctrl-C drains them now)")
        report_backends_once(paths, config)
        result = drain_with_progress(paths, launch, relay=relay, jobs=jobs)
        grace_s = config.shutdown.grace_s
        if relay.interrupted:
            codes = launch.wait(timeout_s=grace_s + 10)
        else:
            codes = launch.terminate(timeout_s=grace_s + 10)
    if as_json:
        _print_outcome(result, relay, codes)
    if relay.interrupted:
        tell(styled(f"interrupted ({', '.join(relay.received)})", Tone.WARNING),
             f": {result.tally.summary()}; workers stopped (exit codes {codes}), unfinished jobs are back in "
             f"the queues: `hpc-rollout launch {run_dir} --local --wait` goes on")
        sys.exit(ExitCode.INTERRUPTED)
    if not result.drained:
        tell(styled("workers ended before the queues drained", Tone.ERROR), f" (exit codes {codes}); see {launch.log_dir}")
        sys.exit(ExitCode.FAILED)
    report_drained(result, f"workers stopped (exit codes {codes})", run_dir, json_on_stdout=as_json)


def _describe_local(run_dir: str, launch: LocalLaunch, workers: int, already: list[WorkerRecord], as_json: bool,
                    ends: str) -> None:
    if as_json:
        click.echo(orjson.dumps({"launch_id": launch.launch_id, "where": "local", "workers": workers,
                                 "pids": launch.pids, "log_dir": str(launch.log_dir), "ends": ends,
                                 "already_alive": _alive_json(already)}).decode())
        return
    say(f"launch {launch.launch_id}: {workers} local worker(s), pids {' '.join(map(str, launch.pids))}")
    say(f"  logs: {launch.log_dir}")
    say(f"  tail -F {launch.log_dir}/worker-*.log")
    say(f"  {ends}")
    _note_already_alive(already, workers)


def _note_already_alive(already: list[WorkerRecord], added: int) -> None:
    if not already:
        return
    launches = sorted({str(w.info.get("launch_id") or "?") for w in already})
    tell(f"note: {len(already)} worker(s) were already working on this run (launch {', '.join(launches)}: "
         f"{', '.join(w.worker_id for w in already)}); these {added} join them, "
         "`hpc-rollout status` shows them all")


def _alive_json(already: list[WorkerRecord]) -> list[dict[str, Any]]:
    return [{"worker_id": w.worker_id, "pid": w.info.get("pid"), "host": w.info.get("host"),
             "launch_id": w.info.get("launch_id")} for w in already]


def _print_outcome(result: DrainResult, relay: SignalRelay, codes: list[int | None]) -> None:
    code = ExitCode.INTERRUPTED if relay.interrupted else result.exit_code
    click.echo(orjson.dumps({"drained": result.drained, "by_status": dict(result.tally.by_status),
                             "retried": result.tally.retried, "interrupted_by": relay.received,
                             "worker_exit_codes": codes, "exit_code": int(code)}).decode())


@click.command("stop")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.option("--no-wait", is_flag=True, help="Return at once instead of waiting for the workers to exit.")
@click.option("--timeout", default=None, type=click.FloatRange(0), help="Seconds to wait (default: grace period + lease).")
@click.option("--cancel", is_flag=True, help="Also scancel the run's Slurm arrays (pending tasks at once, the rest after the drain).")
def stop_cmd(run_dir: str, no_wait: bool, timeout: float | None, cancel: bool) -> None:
    """Drain every worker of RUN_DIR: stop claiming, finish or return running jobs, exit.

    \b
    Examples:
      hpc-rollout stop spool/run1              # wait until every worker has exited
      hpc-rollout stop spool/run1 --no-wait    # ask, and return at once
      hpc-rollout stop spool/run1 --cancel     # also end the run's Slurm arrays
    Workers keep nothing they have not committed: unfinished jobs go back to the queues, and
    the next `launch` takes them up. Exit status 1 when workers are still alive at the timeout.
    """
    paths, config = _open(run_dir)
    request_stop(paths)
    if cancel:
        cancel_run_arrays(paths, pending_only=True)  # tasks not started yet would start later
    alive = [w for w in read_workers(paths, config.leases.lease_s) if w.alive]
    say(f"stop requested ({paths.stop_request}); {len(alive)} worker(s) alive")
    if no_wait and not cancel:
        return
    deadline = time.monotonic() + (timeout if timeout is not None else config.shutdown.grace_s + config.leases.lease_s)
    while alive and time.monotonic() < deadline and not no_wait:
        time.sleep(0.5)
        alive = [w for w in read_workers(paths, config.leases.lease_s) if w.alive]
    if cancel:
        remaining = cancel_run_arrays(paths, pending_only=False)
        if remaining:
            warn(f"still in squeue: {' '.join(remaining)}")
            sys.exit(ExitCode.FAILED)
    if alive and not no_wait:
        warn(f"{len(alive)} worker(s) still alive: {', '.join(w.worker_id for w in alive)}")
        sys.exit(ExitCode.FAILED)
    say("all workers stopped")


def _open(run_dir: str) -> tuple[SpoolPaths, RunConfig]:
    try:
        return open_run(run_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def register(cli: click.Group) -> None:
    cli.add_command(launch_cmd)
    cli.add_command(stop_cmd)

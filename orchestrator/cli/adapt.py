"""`hpc-rollout adapt`: a controller that grows and shrinks a run's node workers with its queues."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

import click

from orchestrator.cli.run_dir import RUN_DIR_TYPE
from orchestrator.cli.console import detach_from_a_lost_terminal, say
from orchestrator.cli.exit_codes import ExitCode
from orchestrator.cli.launch import judge_pools, worker_flags
from orchestrator.cli.slurm_launch import sbatch_flags, slurm_launch_options
from orchestrator.cli.stop_signals import on_stop_signals
from orchestrator.config import ConfigError
from orchestrator.spool.jobs import Stage
from orchestrator.slurm.scaling import Bounds
from orchestrator.slurm.adapt import IDLE_EXIT_S, AdaptError, AdaptSettings, Controller, kind_of, lease_path, state_path
from orchestrator.slurm.cluster import slurm_available
from orchestrator.spool.rundir import open_run
from orchestrator.worker.options import WorkerOptions



@click.command("adapt")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.option("--min", "minimum", default=0, show_default=True, type=click.IntRange(0), help="Workers kept even when idle (launched without idle exit).")
@click.option("--max", "maximum", required=True, type=click.IntRange(1), help="Never more workers than this (running + pending).")
@click.option("--interval", default=10.0, show_default=True, type=click.FloatRange(0.2, 3600), help="Seconds between two looks at the queues.")
@click.option("--cooldown", default=30.0, show_default=True, type=click.FloatRange(0, 86400), help="Seconds after a change before the next one (no flapping).")
@click.option("--lease-timeout", default=60.0, show_default=True, type=click.FloatRange(1, 86400), help="A controller silent this long is replaced by a standby one.")
@worker_flags
@sbatch_flags
def adapt_cmd(run_dir: str, minimum: int, maximum: int, interval: float, cooldown: float, lease_timeout: float,
              worker: WorkerOptions, partition: str | None, time_limit: str, account: str | None, qos: str | None,
              cpus_per_node: int | None, mem: str | None, gpus_per_node: int | None, array_parallelism: int | None,
              exclusive: bool, setup: tuple[str, ...], sbatch_pairs: tuple[str, ...], python_cmd: str | None,
              warn_signal: str, signal_delay: int) -> None:
    """Keep between --min and --max node workers on RUN_DIR, following its queues, until stopped.

    \b
    hpc-rollout adapt spool/run1 --min 0 --max 32 --partition batch --time 04:00:00
    hpc-rollout adapt spool/run1 --max 8 --stages eval --partition cpu --shared   # eval workers
    Unclaimed jobs bring more workers (submitted like `launch --nodes`, same sbatch options);
    workers above --min carry --idle-exit (default: run.toml [workers], else 300 s) and give
    their nodes back when idle; pending tasks no longer needed are withdrawn. Run it on a
    login node or as its own small job; a second controller on the same run stands by and
    takes over when the first stops renewing its lease. Ctrl-C, SIGTERM or `hpc-rollout stop`
    ends it; the workers keep working. `hpc-rollout status RUN_DIR` shows its decisions.
    """
    try:
        paths, config = open_run(run_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    idle_exit_s = worker.idle_exit_s
    worker = worker.resolve(config)
    judge_pools(worker)
    launch_options = slurm_launch_options(1, partition, time_limit, account, qos, cpus_per_node, mem, gpus_per_node,
                                          array_parallelism, exclusive, setup, sbatch_pairs, python_cmd, warn_signal,
                                          signal_delay)
    idle = idle_exit_s if idle_exit_s is not None else (config.workers.idle_exit_s or IDLE_EXIT_S)
    try:
        kind_of(worker.stages)
        slots = worker.pool_size(Stage.RUN if Stage.RUN in worker.stages else Stage.EVAL)
        bounds = Bounds(minimum, maximum, slots, cooldown)
    except (AdaptError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    if idle <= 0:
        raise click.UsageError("--idle-exit 0 would keep every worker forever: adapt needs workers that leave when idle")
    if not slurm_available():
        raise click.ClickException("adapt submits Slurm jobs, and there is no Slurm here (sbatch/srun/squeue not on PATH); "
                                   "use `launch --local --workers N` on this machine")
    settings = AdaptSettings(bounds, idle_exit_s=idle, interval_s=interval, lease_stale_s=max(lease_timeout, 2 * interval))
    controller = Controller(paths.root, settings, launch_options, worker)
    logging.getLogger("orchestrator.slurm.adapt").setLevel(logging.INFO)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            detach_from_a_lost_terminal()   # its last line must not fail on a terminal that is gone
        stop.set()

    on_stop_signals(on_signal)   # Ctrl-C, SIGTERM, SIGHUP: stop deciding, leave the workers working
    say(f"adapt {controller.kind} workers of {paths.root}: --min {minimum} --max {maximum}, "
              f"idle exit {idle:g}s, every {interval:g}s (cool-down {cooldown:g}s)")
    say(f"  lease: {lease_path(paths, controller.kind)}   state: {state_path(paths, controller.kind)}")
    say(f"  watch: hpc-rollout status {run_dir}    end: Ctrl-C (workers keep working)")
    controller.serve(stop.is_set)
    say("adapt: stopped" + (" (the run was stopped)" if controller.run_stopped() else ""))
    if stop.is_set():
        sys.exit(ExitCode.INTERRUPTED)


def register(cli: Any) -> None:
    cli.add_command(adapt_cmd)

"""`python -m orchestrator.worker RUN_DIR`: one worker in the foreground (Slurm, sbatch, launch)."""

from __future__ import annotations

# First, before the imports below (a second or more on a busy node): a stop signal sent while
# the worker starts is a clean stop, not a death by signal.
from orchestrator.worker.signals import catch_stop_signals_early

catch_stop_signals_early()

import logging  # noqa: E402
import sys

import click

from orchestrator.errors import HpcRolloutError
from orchestrator.spool.paths import SpoolPaths
from orchestrator.config import RUNTIME_NAMES
from orchestrator.worker.main import run_worker
from orchestrator.worker.options import OptionsError, WorkerOptions, parse_stages


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--stages", default="all", show_default=True, help="Stages to run: init,run,eval (any subset with run if init).")
@click.option("--init-pool", type=click.IntRange(0), help="Concurrent INIT stages (default: run.toml).")
@click.option("--run-pool", type=click.IntRange(0), help="Concurrent RUN stages (default: run.toml).")
@click.option("--eval-pool", type=click.IntRange(0), help="Concurrent EVAL stages (default: run.toml).")
@click.option("--max-prepared", type=click.IntRange(0), help="INIT pauses while the node's run queue holds this many.")
@click.option("--max-sandboxes", type=click.IntRange(0), help="Cap on INIT + prepared + RUN jobs (0: none).")
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), help="Sandbox runtime.")
@click.option("--idle-exit", "idle_exit_s", type=click.FloatRange(0), help="Exit after this many seconds with nothing to claim and nothing in flight (0: never; default: run.toml).")
@click.option("--launch-id", default="", help="Launch this worker belongs to (set by `hpc-rollout launch`).")
@click.option("--worker-id", default=None, help="Worker id (default: NODE-PID-RANDOM).")
@click.option("--launcher-pid", type=click.IntRange(1), default=None,
              help="The launcher waiting on this worker (set by `launch --wait`): once it is gone, leave as soon "
                   "as nothing is left to claim.")
@click.option("-v", "--verbose", count=True)
def main(run_dir: str, stages: str, init_pool: int | None, run_pool: int | None, eval_pool: int | None,
         max_prepared: int | None, max_sandboxes: int | None, runtime: str | None, idle_exit_s: float | None, launch_id: str,
         worker_id: str | None, launcher_pid: int | None, verbose: int) -> None:
    """Run one stage worker on RUN_DIR until a signal or `hpc-rollout stop`.

    SIGTERM, SIGINT or SIGUSR2: stop claiming, let running stages finish within the grace period
    (run.toml [shutdown] grace_s), return the rest, exit 0; a second one stops at once.
    SIGUSR1: stop at once, every claim back to its queue (what the sbatch template sends when
    the task is preempted).
    """
    options = options_from_cli(stages, init_pool, run_pool, eval_pool, max_prepared, max_sandboxes, runtime,
                               idle_exit_s, launch_id, worker_id, verbose, launcher_pid=launcher_pid)
    try:
        code = run_worker(SpoolPaths.of(run_dir), options)
    except HpcRolloutError as exc:   # a run directory without run.toml, metrics that cannot start, ...
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


def options_from_cli(stages: str, init_pool: int | None, run_pool: int | None, eval_pool: int | None,
                     max_prepared: int | None, max_sandboxes: int | None, runtime: str | None,
                     idle_exit_s: float | None, launch_id: str, worker_id: str | None, verbose: int,
                     launcher_pid: int | None = None) -> WorkerOptions:
    """The options above as WorkerOptions (and the log level): shared with the Slurm node task's
    command line (orchestrator/slurm/node_task.py), which takes the same options."""
    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return WorkerOptions(
            stages=parse_stages(stages), init_pool=init_pool, run_pool=run_pool, eval_pool=eval_pool,
            max_prepared=max_prepared, max_sandboxes=max_sandboxes, runtime=runtime, idle_exit_s=idle_exit_s,
            launch_id=launch_id, worker_id=worker_id, launcher_pid=launcher_pid,
        )
    except OptionsError as exc:
        raise click.UsageError(str(exc)) from None


if __name__ == "__main__":
    main()

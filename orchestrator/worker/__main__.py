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
from orchestrator.settings_click import click_options
from orchestrator.spool.paths import SpoolPaths
from orchestrator.worker.full_spool import disk_full_error
from orchestrator.worker.main import run_worker
from orchestrator.worker.options import WorkerOptions

VERBOSE = click.Option(["-v", "--verbose"], count=True, help="More log lines: -v info, -vv debug.")


@click.command(context_settings={"help_option_names": ["-h", "--help"]},
               params=[click.Argument(["run_dir"], type=click.Path(file_okay=False, exists=True)),
                       *click_options(WorkerOptions, include_by_launcher=True), VERBOSE])
def main(run_dir: str, verbose: int, **options: object) -> None:
    """Run one stage worker on RUN_DIR until a signal or `hpc-rollout stop`.

    SIGTERM, SIGINT or SIGUSR2: stop claiming, let running stages finish within the grace period
    (run.toml [shutdown] grace_s), return the rest, exit 0; a second one stops at once.
    SIGUSR1: stop at once, every claim back to its queue (what the sbatch template sends when
    the task is preempted).
    """
    log_at(verbose)
    try:
        code = run_worker(SpoolPaths.of(run_dir), WorkerOptions.from_params(options))
    except HpcRolloutError as exc:   # a run directory without run.toml, metrics that cannot start, ...
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        if disk_full_error(exc) is None:
            raise
        # Registering (a heartbeat, a claim directory, a journal) is the first write: no job is
        # held yet. A running worker waits out a full spool instead (worker/full_spool.py).
        raise click.ClickException(
            f"the filesystem holding {run_dir} is full ({exc.strerror}): this worker could not register and "
            f"holds no job. See what fills it (df -h {run_dir}; du -sh {run_dir}/* | sort -h), free space "
            "or raise the quota, then start the worker again") from None
    sys.exit(code)


def log_at(verbose: int) -> None:
    """The log level of -v/-vv: shared with the Slurm node task's command line
    (orchestrator/slurm/node_task.py), which takes the same options."""
    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":
    main()

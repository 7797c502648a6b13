"""`python -m orchestrator.slurm.node_task RUN_DIR [worker options] --warning-signal USR2`: the
command a script rendered by `sbatch render worker` runs in each array task. It runs the same
NodeWorker that `launch --nodes` hands to submitit (orchestrator/slurm/node_job.py): one node
worker, and on the warning signal every claim back at once and this task requeued.
"""

from __future__ import annotations

# First, before the imports below (a second or more on a busy node): a warning or stop signal
# sent while Python starts is taken by NodeWorker once it runs, not the default "terminate".
from orchestrator.worker.signals import catch_stop_signals_early

catch_stop_signals_early()

import os  # noqa: E402
import sys  # noqa: E402

import click  # noqa: E402

from orchestrator.errors import HpcRolloutError  # noqa: E402
from orchestrator.slurm.node_job import NodeWorker  # noqa: E402
from orchestrator.slurm.options import DEFAULT_SIGNAL, check_signal  # noqa: E402
from orchestrator.worker.__main__ import log_at, main as worker_command  # noqa: E402
from orchestrator.worker.options import WorkerOptions  # noqa: E402


@click.command(context_settings={"help_option_names": ["-h", "--help"]},
               params=[*worker_command.params,
                       click.Option(["--warning-signal"], default=DEFAULT_SIGNAL, show_default=True,
                                    help="The signal Slurm sends before a preemption or the time limit "
                                         "(#SBATCH --signal=B:SIG@SECONDS).")])
def main(run_dir: str, warning_signal: str, verbose: int, **worker_args: object) -> None:
    """Serve RUN_DIR as the node worker of this Slurm task; on the warning signal return every
    claim at once and requeue this task."""
    log_at(verbose)
    options = WorkerOptions.from_params(worker_args)
    try:
        signal_name = check_signal(warning_signal)
        task_index = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
        code = NodeWorker(run_dir, options, task_index, warning_signal=signal_name)()
    except HpcRolloutError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


if __name__ == "__main__":
    main()

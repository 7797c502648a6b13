"""`PYTHON -u -m orchestrator.slurm.submitit_task -u -m submitit.core._submit FOLDER`: how each task
of `launch --nodes` enters Python (launcher.task_python).

submitit unpickles the node worker, imports that take a second or more on a busy node, before
it listens for the warning signal, and Slurm may send that signal up to 60 s before its time
(sbatch(1), --signal). On a short time limit or an early preemption warning, the signal's
default action would kill the task instead of letting it requeue. So the warning is recorded
from this module's first line, and NodeWorker acts on it once it runs (node_job.py).
"""

from __future__ import annotations

import os
import signal

from orchestrator.worker.signals import catch_stop_signals_early

# submitit's own name for the site's warning signal; launcher.setup_lines exports it when not USR2.
catch_stop_signals_early((signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")],))

import runpy  # noqa: E402
import sys  # noqa: E402


def run(argv: list[str]) -> None:
    """Run `[-u] -m MODULE ARGS...` as `python` would have, in this process."""
    args = list(argv)
    while args[:1] == ["-u"]:   # the interpreter's own flag: this one already runs unbuffered
        args.pop(0)
    if len(args) < 2 or args[0] != "-m":
        raise SystemExit(f"usage: python -m orchestrator.slurm.submitit_task -u -m MODULE [ARGS...], got {argv}")
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run(sys.argv[1:])

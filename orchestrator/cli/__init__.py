"""The `hpc-rollout` command line: a thin layer over the Python API.

Each area of the system adds its commands from its own module through `register(cli)`.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import NoReturn

import click

from orchestrator import __version__
from orchestrator.spool import access

# Modules under orchestrator/cli/ that contribute commands, in help order.
COMMAND_MODULES = ("core", "retry", "export", "handlers", "status", "launch", "adapt", "demo", "sandbox", "llm", "sbatch", "tasks", "report",
                   "doctor")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hpc-rollout")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Rollouts for RL of LLM agents on HPC clusters.

    A run is a directory (the spool) on the shared filesystem: submit tasks into it, start
    stage workers on it (locally or as Slurm arrays), and read trajectories out of its
    Parquet shards. Everything in it can be inspected with ls and cat.

    \b
    Typical session:
      hpc-rollout init spool/demo
      hpc-rollout submit spool/demo tasks.jsonl --samples 8
      hpc-rollout launch spool/demo --local --workers 2 --wait
      hpc-rollout status spool/demo
      hpc-rollout tail spool/demo
    """
    access.own_process()   # files this command creates get the run's modes, whatever the umask
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s")


def _register_all() -> None:
    # No command module imports an optional dependency at import time (torch, wandb, ... are
    # imported by the commands that use them), so an ImportError here is a bug: let it show.
    for name in COMMAND_MODULES:
        importlib.import_module(f"orchestrator.cli.{name}").register(cli)


_register_all()


def main() -> None:
    from orchestrator.cli.errors import run_guarded
    from orchestrator.cli.stop_signals import end_like_ctrl_c

    end_like_ctrl_c()   # SIGTERM and SIGHUP end every command as Ctrl-C does: exit status 130
    # The program itself (the console script, `python -c`) ends with _leave; a caller in the same
    # process (a test) gets the SystemExit, as from any click program.
    program = sys._getframe(1).f_globals.get("__name__") == "__main__"
    try:
        run_guarded(lambda: cli.main(prog_name="hpc-rollout", standalone_mode=False))
    except SystemExit as exc:
        if not program:
            raise
        _leave(exc.code)
    if program:
        _leave(0)


def _leave(code: object) -> NoReturn:
    """Exit with `code` without the interpreter's teardown. Once a command has said everything,
    the teardown can only lose its exit status: a native library's thread (pyarrow, torch) was
    seen to abort it ("terminate called without an active exception", exit -6 instead of the
    launcher's 130). What of the teardown matters is done here: logs and output flushed."""
    if isinstance(code, str):   # sys.exit("message"): said on stderr, status 1
        print(code, file=sys.stderr)
    status = code if isinstance(code, int) else (0 if code is None else 1)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe or terminal: nothing more can be said
            pass
    os._exit(status)

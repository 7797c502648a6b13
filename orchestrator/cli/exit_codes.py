"""The exit status of every `hpc-rollout` command: one table, documented in the README.

    0    everything asked for ended ok
    1    something failed: a job did not end ok (`launch --wait`), a row was rejected (`submit`),
         a task failed its check (`tasks check`), the workers ended before the queues drained,
         or the command itself could not do its work (the one-line error says why)
    2    usage: the command line itself is wrong (click's own code)
    3    cancelled by the user: `launch --wait` saw jobs end `cancelled` (`hpc-rollout cancel`)
         and none fail
    130  interrupted: Ctrl-C, SIGTERM or SIGHUP reached the command (128 + SIGINT, what shells
         report for Ctrl-C); it ends as after Ctrl-C (cli/stop_signals.py): `tail` prints its
         cursor, `serve-llm` closes, a launcher passes the signal on to its workers first

The worker process itself (`python -m orchestrator.worker`, what `launch` starts) has its own
codes, read by launchers and Slurm rather than by people (orchestrator/worker/main.py).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    CANCELLED = 3
    INTERRUPTED = 130

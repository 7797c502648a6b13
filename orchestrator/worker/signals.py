"""The signals that stop a worker, caught from the first line of its entry point.

Importing the worker takes a second or more on a busy node; a launcher that signals it in that
window (`launch --wait` once the queues drained, Slurm at a time limit) must get a clean stop,
not a process killed by the signal's default action. The signals that arrive before the event
loop takes over are recorded here and replayed to it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)   # drain: finish within the grace period
# Preempted: every claim back at once. One signal, because two TERMs sent back to back can reach
# the process as one (standard signals do not queue) and leave it draining.
STOP_NOW_SIGNAL = signal.SIGUSR1

_received_early: list[int] = []


def _record(signum: int, frame: FrameType | None) -> None:
    _received_early.append(signum)


def catch_stop_signals_early(signums: tuple[int, ...] = (*STOP_SIGNALS, STOP_NOW_SIGNAL)) -> None:
    """Record these signals until the worker's event loop installs its own handlers; then let in
    those a launcher held back (see `stop_signals_held`)."""
    for signum in signums:
        signal.signal(signum, _record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signums)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Start worker processes inside this: they begin with the stop signals blocked (a mask is
    inherited through fork and exec), so a signal sent before Python has even started waits
    until `catch_stop_signals_early` can take it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, (*STOP_SIGNALS, STOP_NOW_SIGNAL))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def signals_received_early() -> list[int]:
    """The stop signals recorded before the event loop's handlers (each once, in order)."""
    return list(dict.fromkeys(_received_early))

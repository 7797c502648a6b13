"""A launcher that waits on its workers passes its stop signals on to them.

`launch --wait` and `demo` own the workers they start (each in a session of its own, so a
terminal's Ctrl-C reaches only the launcher). SIGINT, SIGTERM and SIGHUP (Ctrl-C; `kill`, a
cancelled CI job or `timeout`; a dropped ssh session) would otherwise end the launcher alone
and leave its workers running. While a `SignalRelay` is entered:

    first signal    `drain`: the workers stop claiming, finish or return running work within
                    the grace period (run.toml [shutdown] grace_s) and exit
    second signal   `stop_now`: they return running work at once and exit

The launcher keeps watching until its workers are gone and then exits as interrupted. A
launcher killed outright (SIGKILL) cannot pass anything on: its workers notice that it is
gone and leave once nothing is left to claim (orchestrator/worker/idle.py).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

RELAYED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class SignalRelay:
    """Install with `with SignalRelay(drain, stop_now):`; the previous handlers come back on exit.

    The handlers only call `drain`/`stop_now` (signals to other processes, a file write) and
    record what came; what to print is left to the watching loop (`take_notes`), so a signal
    never interrupts a half-printed line with another.
    """

    drain: Callable[[], None]
    stop_now: Callable[[], None]
    on_hangup: Callable[[], None] | None = None   # e.g. stop writing to a terminal that is gone
    received: list[str] = field(default_factory=list)
    _notes: list[str] = field(default_factory=list)
    _previous: dict[int, Any] = field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        return bool(self.received)

    def take_notes(self) -> list[str]:
        """What happened since the last call, for the watcher to print."""
        notes, self._notes = self._notes, []
        return notes

    def replay(self) -> None:
        """Pass on again what already came: for workers started after the signals arrived."""
        if self.received:
            self.drain()
        if len(self.received) > 1:
            self.stop_now()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if signum == signal.SIGHUP and self.on_hangup is not None:
            self.on_hangup()
        if len(self.received) == 1:
            self._notes.append(f"{name}: draining the workers (they finish or return running jobs within the "
                               "grace period); a second Ctrl-C returns running jobs at once")
            self.drain()
        else:
            self._notes.append(f"{name} again: the workers return running jobs to the queues now")
            self.stop_now()

    def __enter__(self) -> "SignalRelay":
        for signum in RELAYED_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

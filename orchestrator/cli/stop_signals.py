"""SIGTERM and SIGHUP end a command as Ctrl-C does: exit status 130 (orchestrator/cli/exit_codes.py).

Python turns SIGINT into KeyboardInterrupt, on which every command already ends cleanly (`tail`
prints its cursor, `status --watch` gives the screen back, `demo` stops what it started) and
cli/errors.py exits 130. SIGTERM (`kill`, `timeout`, a cancelled CI job) and SIGHUP (a dropped ssh
session) would end the process on the spot instead: none of that, and the shell's 143 or 129.
`main()` calls `end_like_ctrl_c` once; a command with handlers of its own (a launcher's
SignalRelay, serve-llm's event loop, adapt's controller) replaces them while it runs. A signal
ignored when the command started (`nohup` ignores SIGHUP) stays ignored.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from orchestrator.cli.console import detach_from_a_lost_terminal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Handler = Callable[[int, FrameType | None], Any]


def end_like_ctrl_c() -> None:
    """From now on SIGTERM and SIGHUP raise KeyboardInterrupt, as SIGINT does."""
    on_stop_signals(_interrupt, (signal.SIGTERM, signal.SIGHUP))


def on_stop_signals(handler: Handler, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
    """Install `handler` for each of `signals` that is not ignored."""
    for signum in signals:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGHUP:
        detach_from_a_lost_terminal()   # the last words (tail's cursor) must not fail on a terminal that is gone
    raise KeyboardInterrupt


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Inside, SIGINT, SIGTERM and SIGHUP wait, so what must be written whole (tail's cursor) is;
    the first that came then acts as it would have. Only the main thread can: elsewhere, nothing waits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous: dict[int, Any] = {}
    for signum in STOP_SIGNALS:
        handler = signal.getsignal(signum)
        if handler is not signal.SIG_IGN:
            previous[signum] = signal.SIG_DFL if handler is None else handler
            signal.signal(signum, lambda number, frame: came.append(number))
    try:
        yield
    finally:
        for waited, handler in previous.items():
            signal.signal(waited, handler)
        if came:
            signal.raise_signal(came[0])

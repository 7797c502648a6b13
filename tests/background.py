"""Waiting for what scripts/test.sh prepares in the background (the task image, mini-swe-agent):
it exports the builder's pid and log; a test that needs the result waits for that pid to end,
then uses (or, on failure, reports) what it left in the cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.process_start import start_time


def wait_for_background(pid_variable: str, what: str, wait_s: float = 1800.0) -> None:
    """Block until the background job named by `pid_variable` (if any) has ended."""
    builder = os.environ.get(pid_variable, "")
    if not builder.isdigit():
        return
    deadline = time.monotonic() + wait_s
    while start_time(int(builder)) is not None:
        assert time.monotonic() < deadline, f"the background {what} (pid {builder}) still runs after {wait_s:.0f} s"
        time.sleep(1.0)


def log_tail(log_variable: str, limit: int = 1500) -> str:
    """The end of a background job's log, with its path, for a failure message."""
    log = Path(os.environ.get(log_variable, "/nonexistent"))
    tail = log.read_text(errors="replace")[-limit:] if log.is_file() else ""
    return f"--- {log} (the background job)\n{tail}"

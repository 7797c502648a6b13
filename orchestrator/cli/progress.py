"""A progress bar over the spool's pending jobs, until they drain."""

from __future__ import annotations

import time
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from orchestrator.local_launch import LocalLaunch
from orchestrator.paths import SpoolPaths
from orchestrator.status import pending_count


def progress_until_drained(paths: SpoolPaths, console: Console, workers_alive: Callable[[], bool],
                           poll_s: float = 0.5) -> bool:
    """Show jobs done / total until nothing is pending; False when the workers are gone first."""
    total = max(pending_count(paths), 1)
    columns = (TextColumn("[bold]jobs"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    started = time.monotonic()
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("jobs", total=total, rate="")
        while True:
            pending = pending_count(paths)
            if pending > total:  # more was submitted while we wait
                total = pending
            done = total - pending
            rate = f"{done / max(time.monotonic() - started, 1e-9):.1f} jobs/s"
            progress.update(bar, total=total, completed=done, rate=rate)
            if pending == 0:
                return True
            if not workers_alive():
                return False
            time.sleep(poll_s)


def drain_with_progress(paths: SpoolPaths, launch: LocalLaunch, console: Console) -> bool:
    """Progress of local workers: False when every one of them exited before the drain."""
    return progress_until_drained(paths, console, lambda: bool(launch.alive()))

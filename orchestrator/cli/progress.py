"""A progress bar over the spool's pending jobs, until they drain."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from orchestrator.local_launch import LocalLaunch, wait_for_drain
from orchestrator.paths import SpoolPaths
from orchestrator.status import pending_count


def drain_with_progress(paths: SpoolPaths, launch: LocalLaunch, console: Console) -> bool:
    """Show jobs done / total until nothing is pending; False when every worker died first."""
    total = max(pending_count(paths), 1)
    columns = (TextColumn("[bold]jobs"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("jobs", total=total, rate="")
        started = time.monotonic()

        def update(pending: int) -> None:
            nonlocal total
            if pending > total:  # more was submitted while we wait
                total = pending
                progress.update(bar, total=total)
            done = total - pending
            progress.update(bar, completed=done, rate=f"{done / max(time.monotonic() - started, 1e-9):.1f} jobs/s")

        return wait_for_drain(paths, launch, update)

"""A progress bar over the spool's pending jobs, until they drain, with ok / failed / retried counts.

Exit status of `launch --wait` (documented in the README): 0 every job that finished while it
waited ended ok (or cancelled); 3 some ended failed or timed out; 1 the workers ended before
the queues drained.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from orchestrator.app.local_launch import LocalLaunch
from orchestrator.spool.paths import SpoolPaths
from orchestrator.report.status import pending_count
from orchestrator.report.tally import RowTally

EXIT_JOBS_FAILED = 3
EXIT_NOT_DRAINED = 1


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    tally: RowTally

    @property
    def exit_code(self) -> int:
        if not self.drained:
            return EXIT_NOT_DRAINED
        return EXIT_JOBS_FAILED if self.tally.failed else 0


def progress_until_drained(paths: SpoolPaths, console: Console, workers_alive: Callable[[], bool],
                           poll_s: float = 0.5) -> DrainResult:
    """Show jobs done / total until nothing is pending; not drained when the workers are gone first.

    Done counts committed rows (each job once); total is done + pending at each look, so a
    ticket counted in a queue and as a row at the same moment never inflates it for good.
    """
    tally = RowTally.from_now(paths)
    columns = (TextColumn("[bold]jobs"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[counts]}"),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn())
    started = time.monotonic()
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("jobs", total=max(pending_count(paths), 1), counts="", rate="")
        while True:
            pending = pending_count(paths)
            tally.refresh()
            done = tally.done
            counts = f"ok {tally.by_status['ok']} · failed {tally.failed} · retried {tally.retried}"
            rate = f"{done / max(time.monotonic() - started, 1e-9):.1f} jobs/s"
            progress.update(bar, total=max(done + pending, 1), completed=done, counts=counts, rate=rate)
            if pending == 0:
                return DrainResult(True, tally)
            if not workers_alive():
                return DrainResult(False, tally)
            time.sleep(poll_s)


def drain_with_progress(paths: SpoolPaths, launch: LocalLaunch, console: Console) -> DrainResult:
    """Progress of local workers: not drained when every one of them exited before the drain."""
    return progress_until_drained(paths, console, lambda: bool(launch.alive()))


_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)


def report_drained(result: DrainResult, stopped: str, run_dir: str) -> None:
    """The last line of `launch --wait` (local or Slurm), and its exit status (DrainResult.exit_code)."""
    if result.tally.failed:
        _err.print(f"drained: {result.tally.summary()}; {stopped}. [red]{result.tally.failed} job(s) did not "
                  f"end ok[/red]: see `hpc-rollout status {run_dir}` for the reasons")
        sys.exit(result.exit_code)
    _out.print(f"drained: {result.tally.summary()}; {stopped}")

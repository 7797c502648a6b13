"""A progress bar over the jobs submitted, each counted once until its row lands, shown until the
queues drain, with ok / failed / retried counts and the LLM backends' health.

Exit status of `launch --wait` (orchestrator/cli/exit_codes.py, documented in the README): 0 every
job that finished while it waited ended ok; 1 some ended failed or timed out, or the workers ended
before the queues drained; 3 some were cancelled by the user and none failed; 130 interrupted.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from rich.console import Console

from orchestrator.app.local_launch import LocalLaunch
from orchestrator.app.signal_relay import SignalRelay
from orchestrator.cli.console import Tone, err, line, plain_column, say, styled, tell
from orchestrator.cli.exit_codes import ExitCode
from orchestrator.config import RunConfig
from orchestrator.llm.registry import BackendRegistry
from orchestrator.report.backend_health import BackendHealth, backend_health
from orchestrator.spool.jobs import JobStatus
from orchestrator.spool.paths import SpoolPaths

# The bar (rich.progress) and the counting of rows (pyarrow) load when a bar is shown: `hpc-rollout`
# imports this module with every command module, at each start.
if TYPE_CHECKING:
    from orchestrator.report.job_progress import JobProgress
    from orchestrator.report.tally import RowTally


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    tally: RowTally

    @property
    def exit_code(self) -> ExitCode:
        if not self.drained or self.tally.failed:
            return ExitCode.FAILED
        if self.tally.by_status[JobStatus.CANCELLED.value]:
            return ExitCode.CANCELLED
        return ExitCode.OK


def health_text(health: BackendHealth) -> str:
    """What the bar says of the backends: nothing without any, the outage while it lasts."""
    if not health.registered and not health.problem:
        return ""
    return health.outage() or f"backends {health.counts()}"


def watch_jobs(paths: SpoolPaths) -> "JobProgress":
    """Where the bar's count starts: take it before the workers start. Taken after, a job they
    finished meanwhile (a loaded node, short jobs) would count as done before the launch."""
    from orchestrator.report.job_progress import JobProgress

    return JobProgress.from_now(paths)


def progress_until_drained(paths: SpoolPaths, console: Console, workers_alive: Callable[[], bool],
                           poll_s: float = 0.5, relay: SignalRelay | None = None,
                           config: RunConfig | None = None, jobs: "JobProgress | None" = None) -> DrainResult:
    """Show jobs done / total until nothing is pending; not drained when the workers are gone first
    (after an interrupt passed on by `relay`, the bar stays until they are).

    Each job counts once, from submission to shard (orchestrator/report/job_progress.py): total is
    the jobs submitted that had no row when `jobs` was taken (watch_jobs; None: now), done those
    with a row since.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    from orchestrator.report.status import pending_count

    config = config or RunConfig.load(paths.run_config)
    jobs = jobs or watch_jobs(paths)
    tally = jobs.tally
    registry = BackendRegistry(paths)
    columns = (plain_column("jobs", style=Tone.STRONG.value), BarColumn(), MofNCompleteColumn(),
               plain_column("{task.fields[counts]}"), plain_column("{task.fields[rate]}"), TimeElapsedColumn(),
               TimeRemainingColumn(), plain_column("{task.fields[health]}"))
    started = time.monotonic()
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("jobs", total=max(jobs.look().total, 1), counts="", rate="", health="")
        while True:
            for note in relay.take_notes() if relay is not None else ():
                progress.console.print(note)
            pending = pending_count(paths)   # whether anything is left, not how much: see JobProgress
            count = jobs.look()
            counts = f"ok {tally.by_status['ok']} · failed {tally.failed} · retried {tally.retried}"
            rate = f"{count.done / max(time.monotonic() - started, 1e-9):.1f} jobs/s"
            health = health_text(backend_health(paths, config, registry))
            progress.update(bar, total=max(count.total, 1), completed=count.done, counts=counts, rate=rate,
                            health=health)
            if pending == 0 and not (relay is not None and relay.interrupted):
                return DrainResult(True, tally)
            if not workers_alive():
                return DrainResult(pending == 0, tally)
            time.sleep(poll_s)


def drain_with_progress(paths: SpoolPaths, launch: LocalLaunch, console: Console = err,
                        relay: SignalRelay | None = None, jobs: "JobProgress | None" = None) -> DrainResult:
    """Progress of local workers: not drained when every one of them exited before the drain."""
    return progress_until_drained(paths, console, lambda: bool(launch.alive()), relay=relay, jobs=jobs)


def report_backends_once(paths: SpoolPaths, config: RunConfig) -> BackendHealth:
    """What `launch --wait` says of the backends as it starts (nothing when none is registered)."""
    health = backend_health(paths, config)
    outage = health.outage()
    if outage:
        tell(styled("warning:", Tone.WARNING), " ", outage)
    elif health.registered:
        tell("backends: " + ", ".join(f"{b.url} {b.state}" for b in health.backends))
    return health


def report_drained(result: DrainResult, stopped: str, run_dir: str, json_on_stdout: bool = False) -> None:
    """The last line of `launch --wait` (local or Slurm), and its exit status (DrainResult.exit_code).
    With --json, standard output holds JSON only: the line goes to standard error."""
    code = result.exit_code
    if result.tally.failed:
        tell(f"drained: {result.tally.summary()}; {stopped}. ",
             styled(f"{result.tally.failed} job(s) did not end ok", Tone.ERROR),
             f": see `hpc-rollout status {run_dir}` for the reasons")
    elif code == ExitCode.CANCELLED:
        tell(f"drained: {result.tally.summary()}; {stopped}. ",
             styled(f"{result.tally.by_status[JobStatus.CANCELLED.value]} job(s) were cancelled", Tone.WARNING),
             f" (exit status {int(code)})")
    else:
        (tell if json_on_stdout else say)(line(f"drained: {result.tally.summary()}; {stopped}"))
    if code != ExitCode.OK:
        sys.exit(code)

"""`hpc-rollout demo`: the whole system on this machine, no Slurm, no GPU."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.console import say, tell
from orchestrator.cli.progress import drain_with_progress

# orchestrator.app.demo (httpx, pyarrow, the local server) is imported by the command itself.
if TYPE_CHECKING:
    from orchestrator.app.local_launch import LocalLaunch
    from orchestrator.spool.paths import SpoolPaths
    from orchestrator.submission.submit import SubmitReport



@click.command("demo")
@click.option("--dir", "run_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory (default: a new spool/demo-DATE-TIME).")
@click.option("--tasks", default=8, show_default=True, type=click.IntRange(1, 10_000), help="Chat tasks.")
@click.option("--samples", default=4, show_default=True, type=click.IntRange(1, 64), help="Samples per task (a group).")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="Local worker processes.")
@click.option("--max-tokens", default=24, show_default=True, type=click.IntRange(1, 512), help="Tokens per reply.")
@click.option("--task", "family", type=click.Choice(["math", "code", "swe"]), default=None,
              help="Run a tool-using agent on the bundled tasks of this family instead of chat.")
@click.option("--policy", type=click.Choice(["scripted", "tiny"]), default="scripted", show_default=True,
              help="--task: a scripted policy that solves the tasks, or the random tiny model.")
@click.option("--image", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="--task: sandbox image (default: the `tasks` image, built once and cached).")
def demo_cmd(run_dir: Path | None, tasks: int, samples: int, workers: int, max_tokens: int,
             family: str | None, policy: str, image: Path | None) -> None:
    """Run real multi-turn chat jobs (or, with --task, tool-using agents) end to end here.

    Starts `serve-llm --tiny` (a small transformers model, built offline and cached on first
    use), registers it as the run's backend, submits TASKS x SAMPLES chat jobs, runs them on
    local stage workers, and prints what landed in the Parquet shards. Everything it starts,
    it stops.

    \b
    With --task math|code|swe: the bundled tasks of that family (20 math problems, 10 code
    problems, 3 SWE repositories) run as agents with tools in bubblewrap sandboxes, against a
    scripted policy that solves them (reward 1) or the random tiny model (--policy tiny).
      hpc-rollout demo --task swe
    """
    from orchestrator.cli.serve_llm import require_torch

    require_torch("demo")
    from orchestrator.app.demo import default_run_dir, run_demo, summary_lines

    run_dir = run_dir or default_run_dir(Path("spool"))
    if family is not None:
        _task_demo(run_dir, family, policy, samples, workers, image)
        return
    tell(f"run directory: {run_dir}   (the first run builds the tiny model: a few seconds)")

    def ready(paths: SpoolPaths, url: str, report: SubmitReport, launch: LocalLaunch) -> None:
        tell(f"serve-llm --tiny at {url}; {report.jobs} chat jobs queued; {len(launch.pids)} workers, logs in {launch.log_dir}")

    result = run_demo(run_dir, tasks, samples, workers, max_tokens, on_ready=ready,
                      wait=lambda paths, launch: drain_with_progress(paths, launch).drained)
    _report(summary_lines(result), result.rows, result.jobs, result.run_dir)


def _report(lines: list[str], rows: list[dict], jobs: int, run_dir: Path, extra_hints: tuple[str, ...] = ()) -> None:
    for line in lines:
        say(line)
    if len(rows) != jobs:
        raise click.ClickException(f"expected {jobs} rows, found {len(rows)}")
    say("look around:")
    for hint in [*paths_hint_for(run_dir), *extra_hints]:
        say(f"  {hint}")


def _task_demo(run_dir: Path, family: str, policy: str, samples: int, workers: int, image: Path | None) -> None:
    from orchestrator.app.agent_demo import run_task_demo, task_summary_lines

    tell(f"run directory: {run_dir}   (the first run builds the task image: a minute or more)")

    def ready(paths: SpoolPaths, url: str, report: SubmitReport, launch: LocalLaunch) -> None:
        tell(f"serve-llm ({policy}) at {url}; {report.jobs} {family} jobs queued; {len(launch.pids)} workers")

    result = run_task_demo(run_dir, family, policy, samples, workers, image=image, on_ready=ready,
                           wait=lambda paths, launch: drain_with_progress(paths, launch).drained)
    job = result.rows[0]["job_id"] if result.rows else "JOB"
    _report(task_summary_lines(result), result.rows, result.jobs, result.run_dir,
            (f"hpc-rollout inspect {result.run_dir} {job}",))


def paths_hint_for(run_dir: Path) -> list[str]:
    from orchestrator.app.demo import paths_hint
    from orchestrator.spool.paths import SpoolPaths

    return paths_hint(SpoolPaths.of(run_dir))


def register(cli: click.Group) -> None:
    cli.add_command(demo_cmd)

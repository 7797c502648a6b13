"""`hpc-rollout demo`: the whole system on this machine, no Slurm, no GPU."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from orchestrator.cli.progress import drain_with_progress
from orchestrator.demo import default_run_dir, paths_hint, run_demo, summary_lines

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


@click.command("demo")
@click.option("--dir", "run_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory (default: a new spool/demo-DATE-TIME).")
@click.option("--tasks", default=8, show_default=True, type=click.IntRange(1, 10_000), help="Chat tasks.")
@click.option("--samples", default=4, show_default=True, type=click.IntRange(1, 64), help="Samples per task (a group).")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="Local worker processes.")
@click.option("--max-tokens", default=24, show_default=True, type=click.IntRange(1, 512), help="Tokens per reply.")
def demo_cmd(run_dir: Path | None, tasks: int, samples: int, workers: int, max_tokens: int) -> None:
    """Run real multi-turn chat jobs end to end on this machine.

    Starts `serve-llm --tiny` (a small transformers model, built offline and cached on first
    use), registers it as the run's backend, submits TASKS x SAMPLES chat jobs, runs them on
    local stage workers, and prints what landed in the Parquet shards. Everything it starts,
    it stops.
    """
    from orchestrator.llm.serve_cmd import require_torch

    require_torch("demo")
    run_dir = run_dir or default_run_dir(Path("spool"))
    err.print(f"run directory: {run_dir}   (the first run builds the tiny model: a few seconds)")

    def ready(paths, url, report, launch) -> None:  # type: ignore[no-untyped-def]
        err.print(f"serve-llm --tiny at {url}; {report.jobs} chat jobs queued; {len(launch.pids)} workers, logs in {launch.log_dir}")

    result = run_demo(run_dir, tasks, samples, workers, max_tokens, on_ready=ready,
                      wait=lambda paths, launch: drain_with_progress(paths, launch, err).drained)
    for line in summary_lines(result):
        out.print(line)
    if len(result.rows) != result.jobs:
        raise click.ClickException(f"expected {result.jobs} rows, found {len(result.rows)}")
    out.print("look around:")
    for hint in paths_hint_for(result.run_dir):
        out.print(f"  {hint}")


def paths_hint_for(run_dir: Path) -> list[str]:
    from orchestrator.paths import SpoolPaths

    return paths_hint(SpoolPaths.of(run_dir))


def register(cli: click.Group) -> None:
    cli.add_command(demo_cmd)

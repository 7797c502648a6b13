"""`hpc-rollout report`: a page of pictures and numbers about a run."""

from __future__ import annotations

import webbrowser

import click

from orchestrator.cli.run_dir import RUN_DIR_TYPE
from orchestrator.cli.console import say
from orchestrator.cli.core import _open
from orchestrator.report.since import parse_duration


def _duration(_: click.Context, __: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("report")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.option("--since", "since_s", metavar="DURATION", callback=_duration,
              help="Only jobs finished and events within this long before now, e.g. 1h, 30m, 2d.")
@click.option("--open", "open_page", is_flag=True, help="Open the page in a web browser ($BROWSER) when done.")
@click.option("--pass-reward", default=1.0, show_default=True, type=float,
              help="A sample passes (pass rate, pass@k) when its reward is at least this.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Write here instead of RUN_DIR/report/.")
def report_cmd(run_dir: str, since_s: float | None, open_page: bool, pass_reward: float, out_dir: str | None) -> None:
    """Write RUN_DIR/report/report.html with its PNG figures, and print a summary.

    \b
    Built from the spool alone (shards, events, heartbeats, backends.json): worker slot
    timeline, queue depths and busy slots, throughput, latency per stage / LLM turn / tool,
    reward by policy version and data source, pass@k, failures with example jobs, backends.
    What could not be read (a corrupt shard, missing events) is named; the page is made anyway.
    \b
    Examples:
      hpc-rollout report spool/run1
      hpc-rollout report spool/run1 --since 1h --open
    """
    from pathlib import Path

    from orchestrator.report.build import ReportError, make_report  # matplotlib loads only for this command

    paths, _ = _open(run_dir)
    try:
        files = make_report(paths, Path(out_dir) if out_dir else None, since_s, pass_reward)
    except ReportError as exc:
        raise click.ClickException(str(exc)) from None
    say(files.text)
    if open_page:
        if not webbrowser.open(files.page.as_uri()):
            say(f"no web browser found: open {files.page.as_uri()} by hand (or set $BROWSER)")


def register(cli: click.Group) -> None:
    cli.add_command(report_cmd)

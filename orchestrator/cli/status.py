"""`hpc-rollout status`: draws the numbers of orchestrator.report.status, once or live (--watch)."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from orchestrator.cli.run_dir import RUN_DIR_TYPE
from orchestrator.cli.console import Tone, format_seconds, line, out, styled
from orchestrator.cli.core import _dumps, _open
from orchestrator.spool.paths import SpoolPaths
from orchestrator.report.finished_values import DEFAULT_PASS_REWARD
from orchestrator.slurm.adapt_status import slurm_section, slurm_section_lines
from orchestrator.report.status import STATUS_SAMPLE_SHARDS, RunStatus, snapshot
from orchestrator.slurm.queries import slurm_warnings


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def render_status(snap: RunStatus, paths: SpoolPaths, run_dir: str, slurm_part: dict[str, Any] | None = None) -> Group:
    parts: list[Any] = [Text(f"run {paths.root}   ({time.strftime('%H:%M:%S')})")]
    jobs = Table()
    jobs.add_column("where")
    jobs.add_column("jobs", justify="right")
    for queue, count in snap.queued.items():
        jobs.add_row(f"queued: {queue}", str(count))
    for worker, count in snap.claimed.items():
        jobs.add_row(f"claimed: {worker}", str(count))
    for status, count in sorted(snap.finished.items()):
        jobs.add_row(f"finished: {status}", str(count))
    parts.append(jobs)
    buffered = sum(int(w.get("buffered_rows", 0) or 0) for w in snap.workers if w["alive"])
    parts.append(Text(
        f"pending {snap.pending} (of which {buffered} finished, waiting for their shard) | shards {snap.shards} | "
        f"{snap.jobs_per_s:.2f} jobs/s, {snap.tokens_per_s:.1f} tokens/s over the last minute"))
    results = snap.results
    if results is not None and results.jobs:
        if not snap.exact:
            parts.append(Text(f"finished-job figures estimated from {snap.shards_read} of {snap.shards} shards "
                              f"(a random sample; --exact reads every shard)"))
        parts.append(Text(
            f"finished {sum(snap.finished.values())}: reward mean {_number(results.reward_mean)} | pass rate {_number(results.pass_rate)} "
            f"(reward >= {results.pass_reward:g}) | {results.tokens} sampled tokens, {_number(results.tokens_per_s)} tokens/s over the run"))
        if results.latency:
            latency = Table(title="time per stage (finished jobs)", title_justify="left")
            for column in ("stage", "n", "p50", "p90", "p99", "max"):
                latency.add_column(column, justify="left" if column == "stage" else "right")
            for stage, p in results.latency.items():
                latency.add_row(stage, str(p.count), *(format_seconds(v) for v in (p.p50, p.p90, p.p99, p.max)))
            parts.append(latency)
        if results.failure_counts:
            parts.append(Text("not ok, by kind: " + ", ".join(f"{kind} {count}" for kind, count in results.failure_counts.items())))
    if snap.workers:
        workers = Table(title="workers", title_justify="left")
        for column in ("worker", "host", "node", "pid", "state", "alive", "heartbeat", "warm-up", "init", "run", "eval",
                       "slurm"):
            workers.add_column(column)
        for w in snap.workers:
            pools = w.get("pools", {})
            cell = lambda s: f"{pools.get(s, {}).get('busy', 0)}/{pools.get(s, {}).get('size', 0)}"  # noqa: E731
            slurm = "_".join(str(w[k]) for k in ("slurm_array_job_id", "slurm_array_task_id") if k in w) or w.get("slurm_job_id", "-")
            workers.add_row(
                w["worker_id"], str(w.get("host")), str(w.get("node")), str(w.get("pid")), str(w.get("state")),
                "yes" if w["alive"] else styled("no", Tone.ERROR), f"{w['age_s']}s ago",
                "-" if w.get("warm_up_s") is None else format_seconds(w["warm_up_s"]),
                cell("init"), cell("run"), cell("eval"), str(slurm),
            )
        parts.append(workers)
    else:
        parts.append(Text(f"no workers: start some with `hpc-rollout launch {run_dir} --local --workers 2`"))
    if snap.failure_reasons:
        parts.append(Text("failure reasons:"))
        parts += [Text(f"  {count:6d}  {reason}") for reason, count in snap.failure_reasons.items()]
    if snap.latest_submissions:
        parts.append(Text(f"submissions (latest {len(snap.latest_submissions)} of {snap.submissions}):"))
        parts += [Text(f"  {s['submission_id']}: {s['jobs']} job(s) {s['first_job']} .. {s['last_job']}"
                       + (f", {s['rejected']} row(s) rejected" if s["rejected"] else "")) for s in snap.latest_submissions]
    parts += _backend_parts(snap)
    parts += [Text(fact) for fact in slurm_section_lines(slurm_part or {})]
    parts += [line(styled("warning:", Tone.WARNING), " ", warning) for warning in snap.warnings]
    return Group(*parts)


def _backend_parts(snap: RunStatus) -> list[Any]:
    """The LLM backends (none registered: nothing) and, while none is usable, the outage line."""
    health = snap.backends
    parts: list[Any] = []
    if health.backends:
        table = Table(title=f"backends: {health.counts()}", title_justify="left")
        for column in ("url", "state", "since", "reason"):
            table.add_column(column)
        tones = {"up": Tone.GOOD, "down": Tone.ERROR, "probing": Tone.WARNING, "draining": Tone.WARNING}
        for backend in health.backends:
            since = time.strftime("%H:%M:%S", time.localtime(backend.since)) if backend.since else "-"
            table.add_row(backend.url, styled(backend.state, tones.get(backend.state, Tone.STRONG)), since,
                          backend.reason or "")
        parts.append(table)
    outage = health.outage()
    if outage:
        parts.append(line(styled("warning:", Tone.ERROR), " ", outage))
    return parts


@click.command("status")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (with --watch: one JSON object per line).")
@click.option("--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds between refreshes with --watch.")
@click.option("--pass-reward", default=DEFAULT_PASS_REWARD, show_default=True, type=float,
              help="A finished job passes when its reward is at least this.")
@click.option("--exact", is_flag=True,
              help=f"Read every shard for the finished-job figures (default: a random sample of "
                   f"{STATUS_SAMPLE_SHARDS} shards, counts scaled; small runs are exact anyway).")
def status_cmd(run_dir: str, as_json: bool, watch: bool, interval: float, pass_reward: float, exact: bool) -> None:
    """Jobs per queue and state, workers, throughput, reward, pass rate, stage latency, failures.

    \b
    Examples:
      hpc-rollout status spool/run1
      hpc-rollout status spool/run1 --watch          # live, refreshed in place
      hpc-rollout status spool/run1 --json | jq .results.reward_mean
      hpc-rollout status spool/run1 --exact          # every shard read, not a sample
    """
    paths, config = _open(run_dir)

    def take() -> tuple[RunStatus, dict[str, Any]]:
        return snapshot(paths, config, pass_reward=pass_reward, exact=exact, scheduler_warnings=slurm_warnings), slurm_section(paths)

    def draw() -> Group:
        snap, slurm_part = take()
        return render_status(snap, paths, run_dir, slurm_part)

    # Ctrl-C, SIGTERM or SIGHUP ends --watch: exit status 130, like any interrupted command (cli/stop_signals.py).
    if as_json:
        while True:
            snap, slurm_part = take()
            click.echo(_dumps({**snap.to_json(), **({"slurm": slurm_part} if slurm_part else {})}, indent=not watch))
            if not watch:
                return
            time.sleep(interval)
    if not watch:
        out.print(draw())
        return
    from rich.live import Live

    with Live(draw(), console=out, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            live.update(draw(), refresh=True)


def register(cli: click.Group) -> None:
    cli.add_command(status_cmd)

"""`init`, `submit`, `status`, `inspect`, `cancel`, `tail`: the spool from the command line."""

from __future__ import annotations

import difflib
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from orchestrator.cli.run_dir import RUN_DIR_TYPE
from orchestrator.cli.console import Tone, say, styled, tell
from orchestrator.cli.stop_signals import signals_deferred
from orchestrator.spool.cancel import request_cancel
from orchestrator.config import STALENESS_NAMES, ConfigError
from orchestrator.spool.rundir import init_run, open_run, planned_config

if TYPE_CHECKING:
    from orchestrator.submission.submit import SubmitReport

# What pulls in pyarrow (submission, inspect_job, rows, tail, cursor) is imported by the command
# that uses it: `hpc-rollout --help` and `status` must not pay for it (tests/core/test_cli_startup.py).


def _open(run_dir: str) -> Any:
    try:
        return open_run(run_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError


def _batch_size(paths: Any) -> int:
    from orchestrator.config import RunConfig

    return RunConfig.load(paths.run_config).jobs.batch_size


def _dumps(value: Any, indent: bool = False) -> str:
    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(value, default=_json_default, option=option | orjson.OPT_SERIALIZE_NUMPY).decode()


@click.command("init")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a run.toml setting, e.g. --set pools.run=16 --set jobs.timeout_s=600.")
def init_cmd(run_dir: str, settings: tuple[str, ...]) -> None:
    """Create the run directory RUN_DIR (or update its run.toml).

    Writes RUN_DIR/run.toml, every setting with a comment (what it does, default, range), and
    RUN_DIR/example-tasks.jsonl: a few echo and sleep tasks that need no LLM and no sandbox.

    \b
    Examples:
      hpc-rollout init spool/demo
      hpc-rollout init spool/run1 --set pools.run=16 --set jobs.timeout_s=600
      hpc-rollout init spool/run1 --set data_sources.openai/gsm8k=answer
    """
    overrides = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep:
            raise click.BadParameter(f"{setting!r}: expected SECTION.KEY=VALUE, e.g. pools.run=16", param_hint="--set")
        overrides[key.strip()] = value.strip()
    from orchestrator.cli.launch import judge_pools
    from orchestrator.worker.options import WorkerOptions

    try:
        judge_pools(WorkerOptions().resolve(planned_config(run_dir, overrides)))   # before anything is written
        paths, _ = init_run(run_dir, overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    example = Path(run_dir) / EXAMPLE_TASKS
    if not example.exists():   # a file the user may have edited is kept
        example.write_text("".join(orjson.dumps(row).decode() + "\n" for row in example_tasks()))
    say(f"run directory ready: {paths.root}")
    say(f"  settings: {paths.run_config} (each explained in a comment)")
    say(f"  example tasks: {example} (echo and sleep: no LLM, no sandbox); `hpc-rollout handlers` lists the others")
    say(f"  next: hpc-rollout submit {run_dir} {example} --samples 4")


EXAMPLE_TASKS = "example-tasks.jsonl"


def example_tasks() -> list[dict[str, Any]]:
    """Tasks that run on any machine: handlers that need no LLM and no sandbox."""
    return [
        {"handler": "echo", "instance": {"instance_id": "hello", "question": "What is 2 + 2?"}},
        {"handler": "echo", "instance": {"instance_id": "half", "reward": 0.5}},
        {"handler": "sleep", "instance": {"instance_id": "coin", "run": {"uniform": [0.2, 1.0]},
                                          "reward": {"bernoulli": 0.5}, "seed": 1}},
        {"handler": "sleep", "instance": {"instance_id": "slow-start", "init": 0.3, "run": 0.5, "eval": 0.1}},
    ]


@click.command("submit")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.argument("tasks_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--handler", help="Handler for bare instances (rows without a handler or data_source).")
@click.option("--samples", default=1, show_default=True, type=click.IntRange(1, 9999),
              help="Jobs per task: one group, sample indices 0..N-1.")
@click.option("--sampling", "sampling_pairs", multiple=True, metavar="KEY=VALUE",
              help="Sampling parameter for every job, e.g. --sampling temperature=0.7 (repeatable).")
@click.option("--sampling-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="JSON object of sampling parameters (--sampling wins on shared keys).")
@click.option("--sampling-unchecked", is_flag=True,
              help="Pass sampling parameters this tool does not know (for a server that takes them).")
@click.option("--source-handler", "source_pairs", multiple=True, metavar="DATA_SOURCE=HANDLER",
              help="Run verl rows of DATA_SOURCE with HANDLER, e.g. openai/gsm8k=answer (repeatable). For this "
                   "submission, over run.toml [data_sources]; run.toml is not changed (to keep a mapping: "
                   "hpc-rollout init RUN_DIR --set data_sources.SRC=HANDLER).")
@click.option("--strict", is_flag=True, help="Accept nothing if any row is malformed.")
@click.option("--again", is_flag=True,
              help="Queue rows an earlier submit of this run queued already (default: skip them, name "
                   "the submission that has them, queue only the new ones; a fixed file can be submitted again).")
@click.option("--set", "instance_pairs", multiple=True, metavar="KEY.PATH=VALUE",
              help="Set a field of every task's instance, e.g. --set harness.command='mini ...' (repeatable; "
                   "JSON values are parsed).")
@click.option("--staleness", type=click.Choice(STALENESS_NAMES), default=None,
              help="When a job's policy falls behind the trainer's bound: restart (cancel it; the sampler "
                   "submits it again) or continue (keep its turns, go on with the new weights). "
                   "Default: run.toml [trainer] staleness.")
@click.option("--class", "resource_class", metavar="NAME",
              help="Resource class of these jobs, one of run.toml [classes] (default: the class listing the "
                   "handler, else the handler's own): what each holds on its node (docs/scale.md).")
@click.option("--json", "as_json", is_flag=True, help="Print what was queued and rejected as one JSON object "
              "(submission_id, jobs, first_job, last_job, rejected: [{line, reason}]); same exit status.")
def submit_cmd(run_dir: str, tasks_file: Path, handler: str | None, samples: int,
               sampling_pairs: tuple[str, ...], sampling_file: Path | None, sampling_unchecked: bool,
               source_pairs: tuple[str, ...],
               strict: bool, again: bool = False, instance_pairs: tuple[str, ...] = (), staleness: str | None = None,
               resource_class: str | None = None, as_json: bool = False) -> None:
    """Queue the tasks in TASKS_FILE (JSON Lines or Parquet) as jobs of RUN_DIR.

    \b
    A row is one of:
      {"handler": "echo", "instance": {...}}
      a verl row: {"data_source": "chat", "prompt": [...], "reward_model": {...}, "extra_info": {...}}
        (a data_source that names no handler, e.g. openai/gsm8k: --source-handler openai/gsm8k=answer)
      a bare instance, with --handler NAME
    Malformed rows are reported with their line numbers; the others are queued (unless
    --strict) and the exit status is 1 when any row was rejected. Instance keys are checked
    against the handler's schema (`hpc-rollout handlers NAME` lists them). Rows an earlier
    submit of the run queued are skipped and named (fix the rejected rows, submit the file
    again: only they are queued); --again queues them anyway.

    \b
    Examples:
      hpc-rollout submit spool/demo spool/demo/example-tasks.jsonl --samples 4
      hpc-rollout submit spool/run1 chats.jsonl --handler chat --samples 8 --sampling temperature=0.7
      hpc-rollout submit spool/run1 gsm8k.parquet --source-handler openai/gsm8k=answer --json
    Agent task families (tools in a sandbox, verifiable rewards; `hpc-rollout tasks --help`):
      hpc-rollout submit spool/run1 deepscaler.parquet --handler math --samples 8
      hpc-rollout submit spool/run1 code.jsonl --handler code --samples 8
      hpc-rollout submit spool/run1 swe_gym.jsonl --handler swe --samples 8
      hpc-rollout submit spool/run1 swe.jsonl --handler harness --set harness.command='mini ...'
    """
    from orchestrator.submission.submit import SubmitError, parse_sampling, parse_source_handlers, submit_file

    paths, _ = _open(run_dir)
    started = time.monotonic()
    try:
        sampling = parse_sampling(sampling_pairs, sampling_file, sampling_unchecked)
        if instance_pairs:   # harness settings and the like, for every row (orchestrator/submission/instance_settings.py)
            from orchestrator.submission.instance_settings import apply_settings, parse_settings
            from orchestrator.submission.submit import read_rows, submit_rows

            try:
                settings = parse_settings(instance_pairs)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--set") from None
            report = submit_rows(paths, apply_settings(read_rows(tasks_file), settings), str(tasks_file), handler,
                                 samples, sampling, strict, sampling_unchecked, parse_source_handlers(source_pairs),
                                 staleness=staleness, skip_submitted=not again, resource_class=resource_class)
        else:
            report = submit_file(paths, tasks_file, handler, samples, sampling, strict, sampling_unchecked,
                                 parse_source_handlers(source_pairs), staleness=staleness, skip_submitted=not again,
                                 resource_class=resource_class)
    except SubmitError as exc:
        raise click.ClickException(str(exc)) from None
    _tell_problems(tasks_file, report)
    elapsed = time.monotonic() - started
    if as_json:
        click.echo(_dumps({**report.to_json(), "samples": samples, "seconds": round(elapsed, 3),
                           **({"strict": True} if strict else {})}))
        if report.rejected:
            sys.exit(1)
        return
    if strict and report.rejected:
        tell(styled("rejected the whole file", Tone.ERROR), f" (--strict): {len(report.rejected)} malformed row(s)")
        sys.exit(1)
    rejected = styled(f", {len(report.rejected)} row(s) rejected", Tone.ERROR) if report.rejected else ""
    skipped = styled(f", {len(report.already)} row(s) skipped as queued already", Tone.WARNING) if report.already else ""
    say(f"submission {report.submission_id}: {report.tasks} task(s) x {samples} sample(s) = {report.jobs} job(s) "
        f"queued in {elapsed:.1f}s", rejected, skipped)
    if report.batches and report.batches < report.jobs:
        say(f"  in {report.batches} queue/init entries of up to {_batch_size(paths)} jobs (jobs.batch_size)")
    if report.jobs:
        say(f"  jobs {report.first_job} .. {report.last_job}")
        _say_routes(report.routes)
        say(_next_step(paths, run_dir))
    if report.rejected:
        sys.exit(1)


def _next_step(paths: Any, run_dir: str) -> str:
    """Start workers, unless some are running already: then they take the new jobs."""
    from orchestrator.config import RunConfig
    from orchestrator.spool.liveness import read_workers

    try:
        lease_s = RunConfig.load(paths.run_config).leases.lease_s
        running = [w for w in read_workers(paths, lease_s) if w.alive and w.info.get("state") in ("starting", "running")]
    except (OSError, ValueError):
        running = []
    if running:
        return f"  {len(running)} worker(s) running will take them: hpc-rollout status {run_dir}"
    return f"  next: hpc-rollout launch {run_dir} --local --workers 2 --wait"


def _tell_problems(tasks_file: Path, report: SubmitReport) -> None:
    """Each distinct reason once, with the lines it holds for; the rows skipped as already queued."""
    from orchestrator.submission.already_submitted import where_in_file

    by_reason: dict[str, list[int]] = {}
    for problem in report.rejected:
        by_reason.setdefault(problem.reason, []).append(problem.line)
    for reason, lines in by_reason.items():
        tell(styled(where_in_file(tasks_file, lines), Tone.ERROR), f": {reason}")
    by_submission: dict[str, list[int]] = {}
    for skipped in report.already:
        by_submission.setdefault(skipped.submission_id, []).append(skipped.line)
    for submission, lines in by_submission.items():
        tell(styled(where_in_file(tasks_file, lines), Tone.WARNING),
             f": queued already by submission {submission}: skipped (--again queues them again)")


def _say_routes(routes: dict[str, str]) -> None:
    """What reward each data_source's rows will get from the handler they were routed to."""
    from orchestrator.handler_api.contract import HandlerError, load_handler

    for source, name in sorted(routes.items()):
        try:
            rule = load_handler(name).reward_rule
        except HandlerError:
            continue
        said = rule.summary if rule else "not declared (hpc-rollout handlers NAME)"
        say(f"  data_source {source} -> {name}: reward {said}")


@click.command("inspect")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect_cmd(run_dir: str, job_id: str, as_json: bool) -> None:
    """One job: input, where it is, event timeline, stage outputs, errors, log paths.

    \b
    Examples:
      hpc-rollout inspect spool/run1 20260101T120000000-ab12-0000003-0001
      hpc-rollout inspect spool/run1 JOB --json | jq .row.error
    Job ids: `hpc-rollout status RUN_DIR` lists the latest submissions' ranges; finished ones
    come with `hpc-rollout tail RUN_DIR --fields job_id,status`.
    """
    from orchestrator.report.inspect_job import JobNotFound, inspect_job

    paths, _ = _open(run_dir)
    try:
        report = inspect_job(paths, job_id)
    except (JobNotFound, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(_dumps(report, indent=True))
        return
    say(styled(f"job {job_id}", Tone.STRONG), f"  ({report.get('where')})")
    say(f"handler: {report.get('handler')}   attempt: {report.get('attempt', report.get('row', {}).get('attempt'))}")
    say(f"input: {_dumps(report.get('instance'))}")
    if report.get("sampling"):
        say(f"sampling: {_dumps(report.get('sampling'))}")
    say("timeline:")
    origin = report["timeline"][0]["t"] if report["timeline"] else 0.0
    for event in report["timeline"]:
        extra = {k: v for k, v in event.items() if k not in ("t", "job", "event", "worker")}
        say(f"  +{event['t'] - origin:9.3f}s  {event['event']:<16} {event.get('worker', '')}  {_dumps(extra) if extra else ''}")
    if report.get("outputs"):
        say(f"outputs: {_dumps(report['outputs'])[:4000]}")
    if report.get("row"):
        row = report["row"]
        seconds = "  ".join(f"{k}={row[k + '_s']:.3f}s" for k in ("init", "run", "eval", "queue") if row.get(k + "_s") is not None)
        say(f"finished: status={row['status']} reward={row['reward']} attempt={row['attempt']}  {seconds}")
        if row.get("model") or row.get("tokenizer_hash"):
            say(f"model: {row.get('model')}   tokenizer: {row.get('tokenizer_hash')}   sampled tokens: {row.get('sampled_tokens')}")
        if row.get("stop_reason"):
            say(f"agent: stop_reason={row['stop_reason']} turns={len(row.get('turns') or [])} "
                f"tool_calls={len(row.get('tool_calls') or [])} malformed={row.get('malformed_calls')}")
        for call in row.get("tool_calls") or []:
            say(f"  turn {call['turn']:>3} {call['name']} {call['arguments'][:300]}")
            status = f"exit={call['exit_code']} {call['output_chars']} chars {call['latency_ms']:.1f} ms"
            say(f"           -> {status}", styled(f" error: {call['error']}", Tone.ERROR) if call.get("error") else "")
            for output_line in (call.get("output") or "").splitlines()[:8]:
                say(f"           | {output_line[:200]}")
    if report.get("error"):
        say(styled("error:", Tone.ERROR), f" {report['error']}")
    if report.get("traceback"):
        say("traceback (most recent call last is at the bottom):")
        say(report["traceback"].rstrip())
    if report.get("attempts"):
        say("attempts (hpc-rollout retry):")
    for number, attempt in enumerate(report.get("attempts", []), 1):
        ended = f"status={attempt['status']} {attempt.get('error') or ''}" if attempt.get("status") else "not finished"
        mark = "  <- this job" if attempt["job_id"] == job_id else ""
        say(f"  {number}. {attempt['job_id']}  {ended.strip()}{mark}")
    if report.get("artifacts"):
        say(f"artifacts: {report['artifacts']}")
    for log_path in report.get("logs", []):
        say(f"log: {log_path}")


@click.command("cancel")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.argument("job_ids", nargs=-1)
@click.option("--group", "groups", multiple=True, help="Cancel every sample of this group (repeatable).")
@click.option("--all", "everything", is_flag=True, help="Cancel every job submitted so far.")
def cancel_cmd(run_dir: str, job_ids: tuple[str, ...], groups: tuple[str, ...], everything: bool) -> None:
    """Cancel jobs wherever they are: running stages are interrupted, sandboxes closed, rows say `cancelled`.

    \b
    Examples:
      hpc-rollout cancel spool/run1 20260101T120000000-ab12-0000003-0001
      hpc-rollout cancel spool/run1 --group 20260101T120000000-ab12-0000003   # every sample of a task
      hpc-rollout cancel spool/run1 --all                                     # everything submitted so far
    `launch --wait` exits 3 when jobs ended cancelled (and none failed).
    """
    if not (job_ids or groups or everything):
        raise click.UsageError("name jobs, --group G or --all")
    paths, _ = _open(run_dir)
    try:
        written = request_cancel(paths, job_ids, groups, everything)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    say(f"cancellation requested: {', '.join(written)} (workers act within a second)")


@click.command("tail")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.option("-f", "--follow", is_flag=True, help="Keep printing rows as new shards are committed.")
@click.option("--since", "cursor", metavar="CURSOR", help="Resume after CURSOR (the JSON printed on stderr at the end).")
@click.option("--cursor-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Resume from the cursor in this file (if it exists) and keep it up to date.")
@click.option("--fields", help="Comma-separated columns to print (default: all).")
@click.option("--poll", default=0.2, show_default=True, type=click.FloatRange(0.01, 60), help="Seconds between checks with --follow.")
def tail_cmd(run_dir: str, follow: bool, cursor: str | None, cursor_file: Path | None, fields: str | None,
             poll: float) -> None:
    """Print finished trajectories as JSON lines, each row once.

    Shards are followed writer by writer in their sequence order (never by clock). The cursor
    printed on stderr resumes where this call stopped: `tail DIR --since 'CURSOR'`, or keep
    it in a file with `--cursor-file`.

    \b
    Examples:
      hpc-rollout tail spool/run1 --fields job_id,status,reward
      hpc-rollout tail spool/run1 --follow --cursor-file run1.cursor | my_trainer_feed
      hpc-rollout tail spool/run1 --since "$(cat run1.cursor)"
    """
    from orchestrator.spool.rows import SCHEMA
    from orchestrator.trainer.cursor import CursorError
    from orchestrator.trainer.tail import RowReader

    paths, _ = _open(run_dir)
    wanted = [f.strip() for f in fields.split(",")] if fields else None
    for name in wanted or []:
        if name not in SCHEMA.names:
            close = difflib.get_close_matches(name, SCHEMA.names, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise click.ClickException(f"--fields: no column '{name}': {hint}columns: {', '.join(SCHEMA.names)}")
    if cursor_file is not None and cursor is None and cursor_file.exists():
        cursor = cursor_file.read_text().strip() or None
    try:
        reader = RowReader(paths, cursor, poll_s=poll, columns=wanted)
    except CursorError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        for row in reader.rows(follow=follow):
            if wanted:
                row = {k: row.get(k) for k in wanted}
            click.echo(_dumps(row))
            if cursor_file is not None and not reader.held:
                _save_cursor(cursor_file, str(reader.cursor))
    finally:   # also on Ctrl-C, SIGTERM or SIGHUP (exit status 130, cli/stop_signals.py): say where to resume
        final = str(reader.cursor)
        with signals_deferred():   # a second signal must not cut the cursor off
            if cursor_file is not None:
                _save_cursor(cursor_file, final)
            tell(f"cursor: {final}")
        reader.close()


def _save_cursor(cursor_file: Path, value: str) -> None:
    from orchestrator.spool import fsops

    fsops.write_atomic(cursor_file.absolute(), value.encode() + b"\n", cursor_file.absolute().parent)


def register(cli: click.Group) -> None:
    for command in (init_cmd, submit_cmd, inspect_cmd, cancel_cmd, tail_cmd):
        cli.add_command(command)

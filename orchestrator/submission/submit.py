"""Turning a file of tasks (JSON Lines or Parquet) into queued jobs.

Accepted row shapes:
    {"handler": "NAME", "instance": {...}}                                  explicit
    {"data_source": "NAME", "prompt": [...], "reward_model": {...}, ...}    verl-style
    {...}                                                                   bare, with --handler NAME

A verl row's handler is, in order: its data_source mapped by `--source-handler SRC=NAME` or
run.toml [data_sources]; the data_source itself when a handler has that name; `--handler`.
So a dataset whose data_source is `openai/gsm8k` submits as it is.

Every bad row is reported with its line number and reason; the good ones are queued unless
`strict`. `samples` jobs are made per task: one group, sample indices 0..samples-1.
"""

from __future__ import annotations

import errno
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import orjson
import pyarrow.parquet as pq

from orchestrator.grading.scorer_sandbox import refuse_local
from orchestrator.grading.verl_reward import refuse_unsandboxed
from orchestrator.config import Staleness
from orchestrator.errors import HpcRolloutError
from orchestrator.spool import fsops, job_ids
from orchestrator.spool.batches import MAX_BATCH_SIZE, chunks, entry_content, entry_name
from orchestrator.spool.cancel import request_cancel
from orchestrator.handler_api.contract import (
    AgentHandler, HandlerError, check_instance, ground_truth_handlers, load_handler,
)
from orchestrator.sandbox.policy import SandboxPolicy
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths
from orchestrator.resource_class import ResourceClass
from orchestrator.submission.classes import ClassChoice, UnknownClass
from orchestrator.submission.already_submitted import AlreadySubmitted, fingerprint, record_prints, submitted_prints
from orchestrator.submission.sampling import sampling_problem
from orchestrator.spool.tickets import Ticket

VERL_KEYS = ("data_source", "prompt")
MAX_SAMPLES = 9999


class SubmitError(HpcRolloutError, ValueError):
    """The submission as a whole cannot be accepted (unreadable file, bad options)."""


@dataclass(frozen=True)
class RowProblem:
    line: int
    reason: str


@dataclass(frozen=True)
class Task:
    line: int
    handler: str
    instance: dict[str, Any]
    instance_id: str
    data_source: str
    fallback_handler: str | None = None   # --handler, for a verl data_source that names no handler
    resource_class: ResourceClass | None = None   # where the run declares classes (submission/classes.py)


@dataclass
class SubmitReport:
    submission_id: str
    source: str
    tasks: int = 0
    jobs: int = 0
    rejected: list[RowProblem] = field(default_factory=list)
    first_job: str = ""
    last_job: str = ""
    batches: int = 0       # queue/init/ entries written (a batch holds up to jobs.batch_size jobs)
    error: str = ""        # why nothing was queued, when queueing failed
    routes: dict[str, str] = field(default_factory=dict)   # verl data_source -> the handler its rows went to
    already: list[AlreadySubmitted] = field(default_factory=list)   # skipped: an earlier submit queued them

    def to_json(self) -> dict[str, Any]:
        return {
            "submission_id": self.submission_id, "source": self.source, "tasks": self.tasks,
            "jobs": self.jobs, "batches": self.batches, "first_job": self.first_job, "last_job": self.last_job,
            "rejected": [{"line": p.line, "reason": p.reason} for p in self.rejected],
            **({"routes": self.routes} if self.routes else {}),
            **({"already_submitted": [{"line": a.line, "submission_id": a.submission_id} for a in self.already]}
               if self.already else {}),
            **({"error": self.error} if self.error else {}),
        }


def read_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row or RowProblem) for a .jsonl/.json or .parquet file."""
    if not path.is_file():
        raise SubmitError(f"{path}: no such file")
    if path.suffix == ".parquet":
        try:
            parquet = pq.ParquetFile(path)
        except Exception as exc:
            raise SubmitError(f"{path}: not a readable Parquet file: {exc}") from None
        line = 0
        for batch in parquet.iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                line += 1
                yield line, row
        return
    with open(path, "rb") as handle:
        for line, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                yield line, orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield line, RowProblem(line, f"not valid JSON ({exc}); each line must be one JSON object")


def parse_task(line: int, row: Any, default_handler: str | None, source_handlers: Mapping[str, str] | None = None) -> Task:
    """Recognise the row's shape; raise ValueError with the reason."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    fallback = None
    if "instance" in row and "handler" in row:
        handler, instance, data_source = row["handler"], row["instance"], str(row.get("data_source") or "")
    elif all(key in row for key in VERL_KEYS):
        data_source = str(row["data_source"])
        mapped = (source_handlers or {}).get(data_source)
        handler, instance = mapped or data_source, row
        fallback = None if mapped else default_handler
    elif default_handler:
        handler, instance, data_source = default_handler, row.get("instance", row) if set(row) == {"instance"} else row, ""
    else:
        raise ValueError(
            'no handler: give {"handler": NAME, "instance": {...}}, a verl row with data_source, '
            "or pass --handler NAME for bare instances"
        )
    if not isinstance(handler, str) or not handler:
        raise ValueError(f"handler must be a non-empty string, got {handler!r}")
    if not isinstance(instance, dict):
        raise ValueError(f"instance must be a JSON object, got {type(instance).__name__}")
    extra_info = instance.get("extra_info")
    extra: dict[str, Any] = extra_info if isinstance(extra_info, dict) else {}
    instance_id = instance.get("instance_id", extra.get("index", ""))
    return Task(line, handler, instance, str(instance_id) if instance_id is not None else "", data_source, fallback)


def submit_file(
    paths: SpoolPaths, source: Path, handler: str | None = None, samples: int = 1,
    sampling: dict[str, Any] | None = None, strict: bool = False, sampling_unchecked: bool = False,
    source_handlers: Mapping[str, str] | None = None, batch_size: int | None = None, staleness: str | None = None,
    skip_submitted: bool = False, resource_class: str | None = None,
) -> SubmitReport:
    return submit_rows(paths, read_rows(source), str(source), handler, samples, sampling, strict, sampling_unchecked,
                       source_handlers, batch_size, staleness, skip_submitted, resource_class)


def submit_rows(
    paths: SpoolPaths, rows: Iterable[tuple[int, Any]], source: str = "<api>", handler: str | None = None,
    samples: int = 1, sampling: dict[str, Any] | None = None, strict: bool = False, sampling_unchecked: bool = False,
    source_handlers: Mapping[str, str] | None = None, batch_size: int | None = None, staleness: str | None = None,
    skip_submitted: bool = False, resource_class: str | None = None,
) -> SubmitReport:
    """Validate every row, then queue samples x accepted tasks (nothing when strict and any failed).

    `skip_submitted` (the CLI's default): tasks an earlier such submission queued are skipped
    and listed in `report.already` (orchestrator/submission/already_submitted.py).

    `source_handlers` maps verl data_source values to handlers, over run.toml's [data_sources];
    `batch_size` (default run.toml's jobs.batch_size) consecutive jobs share a queue entry;
    `staleness` (restart | continue; default run.toml's [trainer] staleness) is what the jobs do
    when their policy falls behind the trainer's bound (orchestrator/spool/staleness.py);
    `resource_class` names the jobs' class, over the handler's (orchestrator/submission/classes.py).
    """
    if not 1 <= samples <= MAX_SAMPLES:
        raise SubmitError(f"--samples {samples} is outside [1, {MAX_SAMPLES}]")
    config = _run_config(paths)
    problem = sampling_problem(dict(sampling or {}), sampling_unchecked)
    if problem:
        raise SubmitError(problem)
    mapping = {**config.data_sources, **(source_handlers or {})}
    batch_size = config.jobs.batch_size if batch_size is None else batch_size
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise SubmitError(f"batch size {batch_size} is outside [1, {MAX_BATCH_SIZE}]")
    try:
        mode = Staleness.parse(config.trainer.staleness if staleness is None else staleness)
    except ValueError as exc:
        raise SubmitError(str(exc)) from None
    try:
        classes = ClassChoice.of(config, resource_class)
    except UnknownClass as exc:
        raise SubmitError(str(exc)) from None
    report = SubmitReport(job_ids.new_submission_id(), source)
    allowed = SandboxChoices(SandboxPolicy.of(config.sandbox), config.sandbox.defaults(), config.sandbox.runtime)
    tasks = _validated_tasks(rows, handler, report, mapping, allowed, classes)
    if strict and report.rejected:
        _record(paths, report)
        return report
    how = {"samples": samples, "sampling": dict(sampling or {}), "staleness": mode.value}
    prints = [fingerprint(t.handler, t.instance, t.instance_id, t.data_source, how) for t in tasks] \
        if skip_submitted else []
    if prints:
        earlier = submitted_prints(paths)
        report.already = [AlreadySubmitted(t.line, earlier[p]) for t, p in zip(tasks, prints) if p in earlier]
        tasks, prints = [t for t, p in zip(tasks, prints) if p not in earlier], [p for p in prints if p not in earlier]
    tickets = _tickets(report, tasks, samples, dict(sampling or {}), mode)
    try:
        names, entries = stage_and_publish(paths, report.submission_id, tickets, batch_size)
    except (OSError, KeyboardInterrupt) as exc:
        report.error = f"nothing was queued: {_describe(exc)}"
        try:  # say what happened, if the spool takes even that
            _record(paths, report)
        except OSError:
            pass
        raise SubmitError(report.error) from None
    report.tasks = len(tasks)
    report.jobs = len(names)
    report.batches = entries
    report.first_job, report.last_job = (names[0], names[-1]) if names else ("", "")
    if prints:   # after the jobs are queued: a failed queueing must not mark its rows as submitted
        record_prints(paths, report.submission_id, prints)
    _record(paths, report)
    return report


def _tickets(report: SubmitReport, tasks: list[Task], samples: int, sampling: dict[str, Any],
             staleness: Staleness = Staleness.RESTART) -> Iterator[Ticket]:
    now = time.time()
    for index, task in enumerate(tasks):
        group = job_ids.group_id(report.submission_id, index)
        for sample in range(samples):
            job = JobSpec(
                job_id=job_ids.job_id(report.submission_id, index, sample), group_id=group,
                instance_id=task.instance_id or group, sample_index=sample, handler=task.handler,
                instance=task.instance, sampling=sampling, submission_id=report.submission_id,
                submitted_at=now, data_source=task.data_source or task.handler, group_size=samples,
                staleness=staleness.value,
                resource_class=task.resource_class.to_json() if task.resource_class is not None else None,
            )
            yield Ticket(job=job, stage=Stage.INIT, enqueued_at=now)


def stage_and_publish(paths: SpoolPaths, submission_id: str, tickets: Iterable[Ticket],
                      batch_size: int = 1) -> tuple[list[str], int]:
    """Queue every ticket or none: all are written (and flushed) aside first, then renamed in.

    Consecutive tickets go `batch_size` to a queue entry (orchestrator/spool/batches.py). The job ids
    queued and the number of entries. Should a rename fail midway, the entries already queued
    are taken back; any job a worker had claimed meanwhile is cancelled, so no job of a failed
    submission runs to a normal end.
    """
    staging = paths.tmp / f".submit-{submission_id}"
    fsops.ensure_dir(staging)
    queued: list[str] = []
    entries: list[tuple[str, list[str]]] = []
    published = 0
    try:
        for batch in chunks(tickets, batch_size):
            name = entry_name(batch)
            fsops.write_new(staging / name, entry_content(batch))
            entries.append((name, [ticket.name for ticket in batch]))
            queued.extend(ticket.name for ticket in batch)
        fsops.sync_filesystem(staging)  # one flush for the whole submission, before any becomes visible
        for name, _ in entries:
            fsops.replace(staging / name, paths.init_queue / name)
            published += 1
        fsops.sync_dir(paths.init_queue)
    except BaseException:
        _withdraw(paths, staging, entries[:published])
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return queued, len(entries)


def _withdraw(paths: SpoolPaths, staging: Path, published: list[tuple[str, list[str]]]) -> None:
    started = [job for name, jobs in published if not fsops.rename(paths.init_queue / name, staging / name) for job in jobs]
    if started:
        request_cancel(paths, tuple(started), check=False)  # no submission record yet


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"no space left on the device holding {exc.filename or 'the spool'}: free some space and submit again"
    return f"{type(exc).__name__}: {exc}"


def _run_config(paths: SpoolPaths) -> Any:
    from orchestrator.config import ConfigError, RunConfig

    try:
        return RunConfig.load(paths.run_config)
    except ConfigError as exc:
        raise SubmitError(str(exc)) from None


@dataclass(frozen=True)
class SandboxChoices:
    """What the run's operator lets a row ask of its sandbox (run.toml [sandbox])."""

    policy: SandboxPolicy
    defaults: dict[str, Any]
    runtime: str = "auto"   # run.toml [sandbox] runtime: `local` has no sandbox for scorers that run code

    def check(self, handler: AgentHandler, task: Task) -> None:
        """SandboxPolicyError (a ValueError: the row is rejected) naming what is not allowed; a
        reward scorer that may run the reply as code where the run has no sandbox to put it in."""
        self.policy.decide(self.defaults, handler.sandbox_request(task.instance), handler=task.handler)
        refuse_unsandboxed(task.instance, self.runtime)
        scorer = handler.code_scorer(task.instance)
        if scorer is not None:
            refuse_local(self.runtime, scorer)


def _validated_tasks(rows: Iterable[tuple[int, Any]], handler: str | None, report: SubmitReport,
                     source_handlers: Mapping[str, str], allowed: SandboxChoices,
                     classes: ClassChoice | None = None) -> list[Task]:
    handlers: dict[str, AgentHandler | HandlerError] = {}

    def find(name: str) -> AgentHandler | HandlerError:
        if name not in handlers:
            try:
                handlers[name] = load_handler(name)
            except HandlerError as exc:
                handlers[name] = exc
        return handlers[name]

    users: dict[tuple[str, str], list[str]] = {}   # (data_source, handler) -> handlers that would use reward_model

    def refuse_ignored_reward_model(handler: AgentHandler, task: Task) -> None:
        """A reward_model the handler would leave unused means rows routed to the wrong handler."""
        ignored = handler.ignored_reward_model(task.instance)
        if ignored is None:
            return
        key = (task.data_source, task.handler)
        if key not in users:
            users[key] = ground_truth_handlers(task.instance, exclude=task.handler)
        found = users[key]
        route = f"--source-handler {task.data_source}=NAME" if task.data_source else "--handler NAME"
        instead = (f"handlers that grade against it and take this row: {', '.join(found)} ({route})" if found
                   else "no installed handler grades against it as the row stands")
        raise ValueError(f"the row carries reward_model, which would be ignored: {ignored}; {instead}; "
                         "or drop reward_model from the row")

    tasks: list[Task] = []
    for line, row in rows:
        if isinstance(row, RowProblem):
            report.rejected.append(row)
            continue
        try:
            task = parse_task(line, row, handler, source_handlers)
            found = find(task.handler)
            if isinstance(found, HandlerError) and task.fallback_handler:
                task = replace(task, handler=task.fallback_handler)
                found = find(task.handler)
            if isinstance(found, HandlerError):
                if task.data_source and task.handler == task.data_source:
                    raise ValueError(
                        f"data_source {task.data_source!r} names no handler: map it with "
                        f"`--source-handler {task.data_source}=HANDLER` (or [data_sources] in run.toml), "
                        f"or pass --handler. {found}"
                    )
                raise ValueError(str(found))
            check_instance(found, task.instance)
            refuse_ignored_reward_model(found, task)
            allowed.check(found, task)
            _check_storable(task.instance)
            if classes is not None:
                task = replace(task, resource_class=classes.resolve(task.handler, found))
            tasks.append(task)
            if task.data_source and task.handler != task.data_source:
                report.routes.setdefault(task.data_source, task.handler)
        except Exception as exc:  # a handler's validation may raise anything: the row is what is wrong
            report.rejected.append(RowProblem(line, str(exc) if isinstance(exc, (ValueError, TypeError))
                                              else f"{type(exc).__name__}: {exc}"))
    return tasks


def _check_storable(instance: dict[str, Any]) -> None:
    """A job travels as JSON in its ticket: refuse at submit time what JSON cannot hold."""
    try:
        orjson.dumps(instance)
    except TypeError as exc:  # bytes, Decimal, sets, nesting deeper than 254 levels...
        raise ValueError(f"the instance cannot be stored as JSON ({exc}); use strings, numbers, "
                         "lists and objects no deeper than 250 levels") from None


def _record(paths: SpoolPaths, report: SubmitReport) -> None:
    fsops.write_atomic(
        paths.submissions / f"{report.submission_id}.json",
        orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2), paths.tmp, fsops.Durability.FULL,
    )


def parse_source_handlers(pairs: tuple[str, ...]) -> dict[str, str]:
    """--source-handler DATA_SOURCE=HANDLER pairs (the data source may contain '/' and '=')."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        source, sep, handler = pair.rpartition("=")
        if not sep or not source or not handler:
            raise SubmitError(f"--source-handler {pair!r}: expected DATA_SOURCE=HANDLER, e.g. openai/gsm8k=answer")
        mapping[source] = handler
    return mapping


def parse_sampling(pairs: tuple[str, ...], file: Path | None, unchecked: bool = False) -> dict[str, Any]:
    """--sampling key=value (values parsed as JSON when they can be) over an optional JSON file."""
    params: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = orjson.loads(file.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise SubmitError(f"--sampling-file {file}: {exc}") from None
        if not isinstance(loaded, dict):
            raise SubmitError(f"--sampling-file {file}: expected a JSON object")
        params.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SubmitError(f"--sampling {pair!r}: expected KEY=VALUE, e.g. temperature=0.7")
        try:
            params[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            params[key] = value
    problem = sampling_problem(params, unchecked)
    if problem:
        raise SubmitError(problem)
    return params

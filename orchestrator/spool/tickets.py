"""A ticket: the file that carries one job through the queues, and all its state so far.

The ticket is the single source of truth about a job in flight: where it sits in the spool
says what happens next, and its content says what happened before (stage outputs, timings,
attempts). It is rewritten atomically at each stage boundary, never edited in place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from orchestrator.errors import HpcRolloutError
from orchestrator.spool.jobs import JobSpec, JobStatus, Stage
from orchestrator.spool.paths import SAFE_NAME


class CorruptTicket(HpcRolloutError, ValueError):
    """A ticket file cannot be decoded; it is quarantined, never deleted."""


@dataclass
class Ticket:
    job: JobSpec
    stage: Stage = Stage.INIT          # the stage this ticket waits for, or is in
    attempt: int = 1
    node: str = ""                     # where INIT prepared it (its run queue)
    state: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    status: JobStatus | None = None    # decided before EVAL when a stage failed or was cancelled
    error: dict[str, str] | None = None
    enqueued_at: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.job.job_id

    def counted_s(self) -> float:
        """Time spent inside stages so far: what the job's budget is charged."""
        return sum(self.timings.get(f"{s.value}_s", 0.0) for s in Stage)

    def add_queue_time(self, now: float) -> None:
        if self.enqueued_at:
            self.timings["queue_s"] = self.timings.get("queue_s", 0.0) + max(0.0, now - self.enqueued_at)

    def mark_enqueued(self, stage: Stage) -> None:
        self.stage = stage
        self.enqueued_at = time.time()

    def back_to_init(self) -> None:
        """The job's sandbox is gone (or going): it must be prepared again, from INIT."""
        self.state.pop("sandbox", None)
        self.outputs.pop("init", None)
        self.mark_enqueued(Stage.INIT)

    # The transitions below are the only writers of stage, status, error, attempt and outputs
    # (tests/core/test_transitions.py holds every other module to that): the worker engine and
    # recovery move tickets through the same rules.

    def return_after_loss(self) -> Stage:
        """Its worker stopped or died mid-job: EVAL when the outcome is decided or it was
        evaluating (EVAL works from shared artifacts, anywhere), else INIT (the sandbox is gone)."""
        if self.status is not None or self.stage is Stage.EVAL:
            self.mark_enqueued(Stage.EVAL)
        else:
            self.back_to_init()
        return self.stage

    def count_lost_attempt(self, error_record: dict[str, str], max_attempts: int, uncharged: int = 0) -> None:
        """One more attempt after a loss; once more than `max_attempts` were charged (every attempt
        but `uncharged` ones, lost through no fault of the job: spool/recovery.py) the job is
        decided `failed` with `error_record` (an undecided job only: a decided one goes on to EVAL)."""
        if self.status is not None:
            return
        self.attempt += 1
        if self.attempt - uncharged > max_attempts:
            self.status = JobStatus.FAILED
            self.error = error_record

    def return_after_infrastructure_loss(self, cause: str, free_losses: int, error_record: dict[str, str],
                                         max_attempts: int) -> bool:
        """Its stage was lost to the infrastructure (a full spool), not to the job: back to where it
        can resume (`return_after_loss`), attempt unchanged for its first `free_losses` such losses;
        each one beyond is charged like an engine error (`count_lost_attempt`), so a spool that keeps
        filling up still ends the job. True when this loss was charged."""
        earlier = sum(1 for entry in self.history if "infrastructure_loss" in entry)
        charged = earlier >= free_losses
        self.history.append({"t": time.time(), "infrastructure_loss": cause, "stage": self.stage.value,
                             "attempt": self.attempt, "charged": charged})
        if charged:
            self.count_lost_attempt(error_record, max_attempts)
        self.return_after_loss()
        return charged

    def record_output(self, stage: Stage, output: dict[str, Any]) -> None:
        self.outputs[stage.value] = output

    def end_early(self, status: JobStatus, error_record: dict[str, str] | None, stage: Stage,
                  output: dict[str, Any]) -> None:
        """A stage before EVAL failed, timed out or was cancelled: the outcome is decided now."""
        self.status = status
        if error_record is not None:
            self.error = error_record
        if output:
            self.record_output(stage, output)

    def keep_error(self, error_record: dict[str, str]) -> None:
        """The first error recorded is the job's error; later ones do not replace it."""
        if self.error is None:
            self.error = error_record

    def resume(self, progress: dict[str, Any]) -> None:
        """Take over the progress a worker journaled for this attempt (its RUN output before
        EVAL, orchestrator/spool/journal.py), exactly as if the ticket had been saved with it."""
        for name, value in self._progress_fields(progress).items():
            setattr(self, name, value)

    def progress(self) -> dict[str, Any]:
        """Everything but the job spec: what a save writes besides the job, and what a
        journal record carries instead of a save."""
        return {
            "stage": self.stage.value,
            "attempt": self.attempt,
            "node": self.node,
            "state": self.state,
            "outputs": self.outputs,
            "timings": self.timings,
            "status": self.status.value if self.status else None,
            "error": self.error,
            "enqueued_at": self.enqueued_at,
            "history": self.history,
        }

    def encode(self) -> bytes:
        return orjson.dumps({"job": self.job.to_json(), **self.progress()})

    @staticmethod
    def _progress_fields(raw: dict[str, Any]) -> dict[str, Any]:
        """The fields of `progress()`, parsed (KeyError, TypeError or ValueError when malformed)."""
        return {
            "stage": Stage(raw["stage"]),
            "attempt": int(raw["attempt"]),
            "node": raw.get("node", ""),
            "state": raw.get("state") or {},
            "outputs": raw.get("outputs") or {},
            "timings": raw.get("timings") or {},
            "status": JobStatus(raw["status"]) if raw.get("status") else None,
            "error": raw.get("error"),
            "enqueued_at": float(raw.get("enqueued_at") or 0.0),
            "history": raw.get("history") or [],
        }

    @classmethod
    def decode(cls, data: bytes, name: str | None = None) -> "Ticket":
        """Parse a ticket; `name` is the file it was read from, which must be its job id.

        The job id becomes file and directory names (claims, queues, job directories), so a
        ticket whose id is not a safe name, or differs from its file's, is refused as corrupt.
        """
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise CorruptTicket(f"cannot decode ticket: {exc}") from exc
        return cls.from_json(raw, name)

    @classmethod
    def from_json(cls, raw: Any, name: str | None = None) -> "Ticket":
        """A ticket from its decoded JSON (one entry of a batch file, say); checked like decode()."""
        try:
            ticket = cls(job=JobSpec.from_json(raw["job"]), **cls._progress_fields(raw))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptTicket(f"cannot decode ticket: {exc}") from exc
        job_id = ticket.job.job_id
        if not isinstance(job_id, str) or not SAFE_NAME.match(job_id):
            raise CorruptTicket(f"job id {job_id!r} is not a safe file name (letters, digits and . _ @ + -)")
        if name is not None and job_id != name:
            raise CorruptTicket(f"ticket file {name!r} carries job id {job_id!r}")
        return ticket

"""A job: one sample of one task, as submitted. Immutable once submitted."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any


class Stage(str, enum.Enum):
    INIT = "init"
    RUN = "run"
    EVAL = "eval"


class JobStatus(str, enum.Enum):
    """Final status of a job, as written in its shard row."""

    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class JobSpec:
    job_id: str             # <submission>-<task index:06d>-<sample index:03d>; sorts in submission order
    group_id: str           # <submission>-<task index:06d>; shared by the samples of one task
    instance_id: str        # the task's own id when it has one, else the group id
    sample_index: int
    handler: str
    instance: dict[str, Any]
    sampling: dict[str, Any] = field(default_factory=dict)
    submission_id: str = ""
    submitted_at: float = 0.0
    data_source: str = ""   # verl rows keep theirs; otherwise the handler name
    group_size: int = 1     # samples in the group (--samples)
    # What the job does when its policy falls behind the trainer's bound: restart | continue
    # (orchestrator.config.Staleness), fixed at submission (run.toml [trainer] staleness by default).
    staleness: str = "restart"
    # Its resource class where the run declares classes (orchestrator/resource_class.py: name,
    # memory_mb, cpus, expected_s, weight, max_jobs); None: no class, and no key in the ticket.
    resource_class: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        # Shallow on purpose: asdict() deep-copies the instance and recurses once per nesting level.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.resource_class is None:
            del data["resource_class"]   # tickets of runs without classes, byte for byte as before
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "JobSpec":
        return cls(**data)


@dataclass(frozen=True)
class StageError:
    stage: str          # init | run | eval
    kind: str           # exception class name, or "timeout" / "cancelled"
    message: str        # for an exception: its text and where it was raised (file:line in function)
    traceback: str = ""  # the full traceback of an exception (events, `inspect`, the worker log)

    def as_text(self) -> str:
        return f"{self.stage}: {self.kind}: {self.message}"

    def to_record(self) -> dict[str, str]:
        """What the ticket keeps (and the row shows): stage, kind, message; the traceback stays in events."""
        return {"stage": self.stage, "kind": self.kind, "message": self.message}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "StageError":
        return cls(str(record.get("stage", "")), str(record.get("kind", "")), str(record.get("message", "")))

"""The small files of a run a report needs besides shards and events: heartbeats, submissions, backends."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from orchestrator.llm.errors import RegistryCorrupt
from orchestrator.llm.history import read_history
from orchestrator.llm.registry import Backend, parse_snapshot
from orchestrator.spool import fsops
from orchestrator.spool.job_ids import submitted_at
from orchestrator.spool.paths import SpoolPaths


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    node: str
    host: str
    state: str
    gone: bool                      # its heartbeat is under workers/gone/ (stopped or declared lost)
    started_at: float
    heartbeat_at: float
    pool_sizes: dict[str, int]      # stage -> slots
    counters: dict[str, int]
    warm_up_s: float | None = None  # its tokenizers loaded before its first RUN (orchestrator/worker/warm_up.py)


@dataclass(frozen=True)
class Submission:
    submission_id: str
    at: float                       # epoch seconds, from the submission id
    jobs: int


@dataclass(frozen=True)
class SpoolFiles:
    workers: tuple[WorkerInfo, ...]
    submissions: tuple[Submission, ...]
    backends: tuple[Backend, ...]
    policy_version: int
    backend_history: tuple[dict[str, Any], ...]
    problems: tuple[str, ...] = field(default=())


def read_spool_files(paths: SpoolPaths) -> SpoolFiles:
    problems: list[str] = []
    workers = _read_workers(paths, problems)
    submissions = _read_submissions(paths, problems)
    backends: tuple[Backend, ...] = ()
    policy_version = 0
    if paths.backends.is_file():
        try:
            snapshot = parse_snapshot(fsops.read_bytes(paths.backends), paths.backends)
            backends, policy_version = snapshot.backends, snapshot.policy_version
        except RegistryCorrupt as exc:
            problems.append(str(exc).split(";")[0])
        except OSError as exc:
            problems.append(f"{paths.backends.name}: unreadable ({exc})")
    problems += _quarantined(paths)
    history, bad = read_history(paths.backends_history)
    if bad:
        problems.append(f"{paths.backends_history.relative_to(paths.root)}: {bad} unreadable line(s) skipped")
    return SpoolFiles(tuple(workers), tuple(submissions), backends, policy_version, tuple(history), tuple(problems))


def _json_files(directory: Path) -> list[Path]:
    try:
        return sorted(directory / e.name for e in os.scandir(directory) if e.name.endswith(".json") and e.is_file())
    except FileNotFoundError:
        return []


def _read_workers(paths: SpoolPaths, problems: list[str]) -> list[WorkerInfo]:
    found = []
    for gone, directory in ((False, paths.workers), (True, paths.workers / "gone")):
        for path in _json_files(directory):
            try:
                info = orjson.loads(fsops.read_bytes(path))
                pools = {stage: int(p.get("size", 0)) for stage, p in (info.get("pools") or {}).items()}
                found.append(WorkerInfo(
                    worker_id=path.stem, node=str(info.get("node", "")), host=str(info.get("host", "")),
                    state=str(info.get("state", "")), gone=gone, started_at=float(info.get("started_at") or 0),
                    heartbeat_at=float(info.get("heartbeat_at") or 0), pool_sizes=pools,
                    counters={k: int(v) for k, v in (info.get("counters") or {}).items()},
                    warm_up_s=None if info.get("warm_up_s") is None else float(info["warm_up_s"]),
                ))
            except (OSError, orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
                problems.append(f"{path.relative_to(paths.root)}: unreadable heartbeat ({exc})")
    return found


QUARANTINE_LISTED = 20


def _quarantined(paths: SpoolPaths) -> list[str]:
    """Files workers moved aside as unreadable (tickets, shards): their jobs are not in the numbers."""
    try:
        names = sorted(e.name for e in os.scandir(paths.quarantine) if not e.name.endswith(".reason"))
    except FileNotFoundError:
        return []
    found = []
    for name in names[:QUARANTINE_LISTED]:
        try:
            reason = fsops.read_bytes(paths.quarantine / f"{name}.reason").decode("utf-8", "replace").strip().splitlines()[0][:200]
        except (OSError, IndexError):
            reason = "no reason recorded"
        found.append(f"quarantine/{name}: {reason}")
    if len(names) > QUARANTINE_LISTED:
        found.append(f"... and {len(names) - QUARANTINE_LISTED} more file(s) in {paths.quarantine}")
    return found


def _read_submissions(paths: SpoolPaths, problems: list[str]) -> list[Submission]:
    found = []
    for path in _json_files(paths.submissions):
        try:
            info = orjson.loads(fsops.read_bytes(path))
            stamped = submitted_at(str(info["submission_id"]))
            at = stamped if math.isfinite(stamped) else path.stat().st_mtime
            found.append(Submission(str(info["submission_id"]), at, int(info.get("jobs", 0))))
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            problems.append(f"{path.relative_to(paths.root)}: unreadable submission record ({exc})")
    return found

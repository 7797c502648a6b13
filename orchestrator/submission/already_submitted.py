"""Rows an earlier `hpc-rollout submit` of the run queued: a file submitted again queues only what is new.

A user who fixes the rejected rows of a file and submits it again must not get the good rows
twice. Each idempotent submission (the CLI's default) leaves `submissions/ID.rows`, one line
per task it queued: the task's fingerprint, a hash of what the row asks for (handler, instance,
instance_id, data_source) and how (samples, sampling, staleness), not of its line number. The
next one skips a task whose fingerprint is there and names the submission that queued it;
`--again` queues it anyway. The same rows at another temperature are new tasks. Copies within one file are the user's: a file of 150 identical rows queues 150 tasks.
The API (`Spool.submit`, the samplers) is not idempotent: a trainer resubmits prompts on purpose.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

ROWS_SUFFIX = ".rows"


@dataclass(frozen=True)
class AlreadySubmitted:
    line: int
    submission_id: str   # the earlier submission that queued the same task


def fingerprint(handler: str, instance: dict[str, Any], instance_id: str, data_source: str,
                how: dict[str, Any]) -> str:
    what = {"handler": handler, "instance": instance, "instance_id": instance_id, "data_source": data_source,
            "how": how}
    canonical = orjson.dumps(what, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY, default=str)
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def submitted_prints(paths: SpoolPaths) -> dict[str, str]:
    """Fingerprint -> the first submission that queued it, over every `.rows` file of the run."""
    found: dict[str, str] = {}
    for name in sorted(fsops.list_names(paths.submissions)):   # submission ids sort by time
        if not name.endswith(ROWS_SUFFIX):
            continue
        try:
            lines = fsops.read_bytes(paths.submissions / name).decode("ascii").split()
        except (OSError, UnicodeDecodeError):
            continue   # unreadable: those rows can be queued again, the lesser harm than refusing them
        submission = name[: -len(ROWS_SUFFIX)]
        for line in lines:
            found.setdefault(line, submission)
    return found


def record_prints(paths: SpoolPaths, submission_id: str, prints: Iterable[str]) -> None:
    text = "".join(f"{p}\n" for p in prints).encode("ascii")
    fsops.write_atomic(paths.submissions / f"{submission_id}{ROWS_SUFFIX}", text, paths.tmp, fsops.Durability.FULL)


def where_in_file(file: object, lines: list[int], shown: int = 5) -> str:
    """`tasks.jsonl:3` for one line (as editors and compilers say it); `tasks.jsonl: lines 3, 5, 7,
    9, 11 and 4 more` for many, so that one reason shared by many rows is one line of text."""
    if len(lines) == 1:
        return f"{file}:{lines[0]}"
    more = f" and {len(lines) - shown} more" if len(lines) > shown else ""
    return f"{file}: lines {', '.join(str(n) for n in lines[:shown])}{more}"

"""One step's rows, under a time limit (verl's or TRL's step); and at the limit, a cut that leaves nothing running.

At `time_limit_s` the step's unfinished groups are cancelled (cancel/group-G, which every worker
polls every 0.5 s). A cancelled job ends at once: its LLM request is aborted with it (the closed
connection aborts it on vLLM and serve-llm, SGLang is also sent /abort_request: llm/client.py),
its sandbox is closed, and it leaves a `cancelled` row. The step then waits, for `cancel_grace_s`
at most, until every cut job is really gone: each sample has its row, no queue entry or claim of
the step's submissions is left (a claim is dropped right after its row is committed), and the
backends' own gauges count no request (a server aborts a closed request only at its next step:
orchestrator/llm/busy.py). So when generate_sequences returns, verl may put its servers to sleep:
nothing of the step generates.

What the limit cut is returned as a `Cut` (meta_info["hpc_rollout"]["time_limit"]), including
anything still there when the grace ran out. Nothing here imports verl.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.spool import fsops
from orchestrator.spool.batches import first_job_of
from orchestrator.spool.job_ids import group_id, parse_group_id, parse_job_id
from orchestrator.spool.paths import SpoolPaths
from orchestrator.trainer.stall import STALL_WARN_S, StallNotice

log = logging.getLogger(__name__)

Row = Mapping[str, Any]


class RowSource(Protocol):
    def rows(self, follow: bool = False) -> Iterable[Row]: ...

    def wait(self, timeout_s: float) -> None: ...   # until new rows may have come, `timeout_s` at most


class Placement(Protocol):
    """Where the step's samples go: group id -> the slot of each of its samples."""

    rows_of_group: dict[str, list[int]]

    def slot(self, group_id: str, sample_index: int) -> int | None: ...


@dataclass
class GroupSlots:
    """The Placement of one submission of `tasks` groups of `samples` each, slots in order."""

    rows_of_group: dict[str, list[int]]

    @classmethod
    def of(cls, submission: str, tasks: int, samples: int) -> "GroupSlots":
        return cls({group_id(submission, task): [task * samples + s for s in range(samples)] for task in range(tasks)})

    def slot(self, group_id: str, sample_index: int) -> int | None:
        rows = self.rows_of_group.get(group_id)
        return rows[sample_index] if rows is not None and 0 <= sample_index < len(rows) else None


@dataclass
class Cut:
    """What the time limit cut from one step."""

    limit_s: float
    grace_s: float
    groups: int = 0                      # groups cancelled at the limit
    samples: int = 0                     # their samples without a row then
    gone_after_s: float | None = None    # the cancel to the last cut job gone; None: the grace ran out first
    missing: int = 0                     # samples still without a row at the return
    left_behind: list[str] = field(default_factory=list)   # queue entries and claims of the step at the return
    still_generating: list[str] = field(default_factory=list)   # backends counting a request at the return

    def to_json(self) -> dict[str, Any]:
        return {"limit_s": self.limit_s, "grace_s": self.grace_s, "cancelled_groups": self.groups,
                "cancelled_samples": self.samples,
                "gone_after_s": None if self.gone_after_s is None else round(self.gone_after_s, 3),
                "missing": self.missing, "left_behind": list(self.left_behind),
                "still_generating": list(self.still_generating)}


def collect(reader: RowSource, placement: Placement, size: int, paths: SpoolPaths,
            cancel: Callable[[list[str]], object], limit_s: float | None, grace_s: float, poll_s: float,
            started: float, busy: Callable[[], list[str]] | None = None,
            stall_after_s: float = STALL_WARN_S) -> tuple[list[Row | None], Cut | None]:
    """The row of every slot (None: none came) and what the limit cut (None: nothing).

    Rows are followed until every slot has one; with `limit_s`, at `started + limit_s` the groups
    still open are cancelled with `cancel(groups)`, and the wait goes on until the cut jobs are
    gone and `busy()` names no backend (orchestrator/llm/busy.py), or `grace_s` has passed.
    A wait with no new row for `stall_after_s` warns, naming the live workers (trainer/stall.py)."""
    slots: list[Row | None] = [None] * size
    left = size
    cut: Cut | None = None
    cut_at = 0.0
    stall = StallNotice(paths, started, stall_after_s)
    while True:
        came = left
        for row in reader.rows(follow=False):
            slot = placement.slot(str(row.get("group_id")), int(row.get("sample_index") or 0))
            if slot is not None and slots[slot] is None:
                slots[slot] = row
                left -= 1
        now = time.monotonic()
        if left < came:
            stall.rows_came(now)
        if cut is None:
            if not left:
                return slots, None
            stall.check(now, left, size)
            if limit_s is not None and now >= started + limit_s:
                open_groups = open_groups_of(placement, slots)
                cancel(open_groups)
                cut, cut_at = Cut(limit_s, grace_s, len(open_groups), left), now
                log.warning("time limit %.0f s: %d sample(s) of %d group(s) cancelled; waiting up to %.0f s "
                            "(cancel_grace_s) for them to be gone", limit_s, left, len(open_groups), grace_s)
        else:
            # Every slot has its row: the cut jobs ended; their claims go right after their rows.
            left_behind = step_entries(paths, _submissions(placement)) if not left else None
            # Only once the spool side is gone: a backend still counting then has an abort to come.
            generating = busy() if left_behind == [] and busy is not None else []
            if left_behind == [] and not generating:
                cut.gone_after_s = now - cut_at
                return slots, cut
            if now - cut_at >= grace_s:
                cut.missing = left
                cut.left_behind = step_entries(paths, _submissions(placement)) if left_behind is None else left_behind
                cut.still_generating = generating
                log.warning("the cut jobs were not all gone within cancel_grace_s %.0f s: %d sample(s) without a row "
                            "(masked as missing); still queued or claimed: %s; backends still counting a request: %s",
                            grace_s, left, ", ".join(cut.left_behind) or "nothing", ", ".join(generating) or "none")
                return slots, cut
        reader.wait(poll_s)


def step_entries(paths: SpoolPaths, submissions: set[str]) -> list[str]:
    """Queue entries and claims that hold jobs of these submissions: a listing of each queue and of
    each worker's claims, made only after a cut (never per poll of a step that ends by itself)."""
    places = [paths.init_queue, paths.eval_queue, *paths.run_queues()]
    if paths.active.is_dir():
        places += [paths.active / name for name in fsops.list_names(paths.active)]
    found = []
    for place in places:
        for name in fsops.list_names(place):
            if _submission_of(name) in submissions:
                found.append(f"{place.relative_to(paths.root)}/{name}")
    return sorted(found)


def _submission_of(name: str) -> str:
    parsed = parse_job_id(first_job_of(name))
    return parsed.submission if parsed is not None else ""


def _submissions(placement: Placement) -> set[str]:
    return {parsed.submission for group in placement.rows_of_group
            if (parsed := parse_group_id(group)) is not None}


def open_groups_of(placement: Placement, slots: Sequence[Row | None]) -> list[str]:
    """Groups with a sample still without its row."""
    return [g for g, rows in placement.rows_of_group.items() if any(slots[r] is None for r in rows)]

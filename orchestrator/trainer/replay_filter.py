"""What a replay query selects, as one pyarrow expression the Parquet scan evaluates itself.

Every field left at its default selects everything; the fields given are ANDed. The
expression is pushed down into the scan (orchestrator/trainer/replay.py): row groups whose
statistics exclude it are skipped, and rows are filtered in Arrow, never as Python dicts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from orchestrator.errors import HpcRolloutError
from orchestrator.spool.jobs import JobStatus

STATUSES = tuple(status.value for status in JobStatus)


class QueryError(HpcRolloutError, ValueError):
    """A query field out of its range or naming an unknown value."""


@dataclass(frozen=True)
class Query:
    """Rows to select; a group is returned (whole) when one of its rows is selected."""

    prompts: tuple[str, ...] = ()          # instance_id (the prompt's id) of the row
    prompt_contains: str | None = None     # text inside the row's task (its `instance` JSON)
    groups: tuple[str, ...] = ()           # group_id
    handlers: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()         # ok | failed | timeout | cancelled
    failed: bool | None = None             # True: status is not ok; False: status is ok
    reward_min: float | None = None        # inclusive bounds; a row without a reward never matches one
    reward_max: float | None = None
    version_min: int | None = None         # every turn sampled at a policy version >= this
    version_max: int | None = None         # ... and <= this
    turns_min: int | None = None           # number of model turns (a row without turns has 0)
    turns_max: int | None = None

    def __post_init__(self) -> None:
        for name in ("prompts", "groups", "handlers", "statuses"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        unknown = [s for s in self.statuses if s not in STATUSES]
        if unknown:
            raise QueryError(f"unknown status {unknown}: valid are {', '.join(STATUSES)}")
        for low, high in (("reward_min", "reward_max"), ("version_min", "version_max"), ("turns_min", "turns_max")):
            lo, hi = getattr(self, low), getattr(self, high)
            for name, value in ((low, lo), (high, hi)):
                if value is not None and not math.isfinite(value):
                    raise QueryError(f"{name} must be a finite number, not {value}")
            if lo is not None and hi is not None and lo > hi:
                raise QueryError(f"{low} ({lo}) is above {high} ({hi}): nothing could match")

    def is_everything(self) -> bool:
        return all(getattr(self, f.name) == f.default for f in fields(self))

    def columns(self) -> set[str]:
        """The shard columns the expression reads."""
        wanted = {"prompts": "instance_id", "prompt_contains": "instance", "groups": "group_id",
                  "handlers": "handler", "statuses": "status", "failed": "status", "reward_min": "reward",
                  "reward_max": "reward", "version_min": "policy_version_min", "version_max": "policy_version_max",
                  "turns_min": "turns", "turns_max": "turns"}
        return {column for name, column in wanted.items() if getattr(self, name) != getattr(Query, name)}

    def expression(self) -> ds.Expression | None:
        """The selection as one Arrow expression (None: every row)."""
        terms: list[ds.Expression] = []
        terms += _one_of("instance_id", self.prompts) + _one_of("group_id", self.groups)
        terms += _one_of("handler", self.handlers) + _one_of("status", self.statuses)
        if self.prompt_contains is not None:
            terms.append(pc.match_substring(ds.field("instance"), self.prompt_contains))
        if self.failed is not None:
            ok = ds.field("status") == "ok"
            terms.append(~ok if self.failed else ok)
        terms += _within(ds.field("reward"), self.reward_min, self.reward_max)
        terms += _within(ds.field("policy_version_min"), self.version_min, None)
        terms += _within(ds.field("policy_version_max"), None, self.version_max)
        if self.turns_min is not None or self.turns_max is not None:
            turns = pc.coalesce(pc.list_value_length(ds.field("turns")), 0)
            terms += _within(turns, self.turns_min, self.turns_max)
        if not terms:
            return None
        selected = terms[0]
        for term in terms[1:]:
            selected = selected & term
        # A null (a reward or version the row lacks) selects nothing, rather than being an error.
        return pc.coalesce(selected, pa.scalar(False))


def _one_of(column: str, values: Iterable[str]) -> list[ds.Expression]:
    values = list(values)
    return [ds.field(column).isin(values)] if values else []


def _within(value: Any, low: float | None, high: float | None) -> list[ds.Expression]:
    terms = []
    if low is not None:
        terms.append(value >= low)
    if high is not None:
        terms.append(value <= high)
    return terms

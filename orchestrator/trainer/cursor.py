"""A reader's cursor: how far it has read each writer's shards, and what it still holds.

    {"v": 1, "next": {"node1-88-ab12": 14, ...}, "held": {"node1-88-ab12": {"13": [[0, 2], [5, 6]]}}}

`next[w]` is the next shard sequence number of writer `w` the reader has not fetched yet;
`held[w][seq]` lists row ranges [start, end) of fetched shards that were *not delivered*
to the trainer (a shard half consumed, samples of a group still incomplete). Every row is
therefore in exactly one of three places: delivered (before `next`, not held), held (read
again on resume), or not fetched yet (from `next` on). A trainer that stores the cursor
together with what it has trained on resumes with no row lost and none twice.

The value is small: one entry per writer, plus ranges of the rows held back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from orchestrator.errors import HpcRolloutError

FORMAT = 1

RowKey = tuple[str, int, int]   # (writer, shard seq, row index in the shard)


class CursorError(HpcRolloutError, ValueError):
    """A cursor string or file cannot be parsed."""


@dataclass(frozen=True)
class Cursor:
    next_seq: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[str, Mapping[int, tuple[tuple[int, int], ...]]] = field(default_factory=dict)

    @classmethod
    def of(cls, next_seq: Mapping[str, int], held_keys: Iterable[RowKey]) -> "Cursor":
        rows: dict[str, dict[int, list[int]]] = {}
        for writer, seq, index in held_keys:
            rows.setdefault(writer, {}).setdefault(seq, []).append(index)
        held = {w: {s: _ranges(sorted(i)) for s, i in sorted(by_seq.items())} for w, by_seq in sorted(rows.items())}
        return cls(dict(sorted(next_seq.items())), held)

    def held_keys(self) -> list[RowKey]:
        return [(w, s, i) for w, by_seq in self.held.items() for s, spans in by_seq.items()
                for start, end in spans for i in range(start, end)]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"v": FORMAT, "next": dict(self.next_seq)}
        if self.held:
            data["held"] = {w: {str(s): [list(r) for r in spans] for s, spans in by_seq.items()}
                            for w, by_seq in self.held.items()}
        return data

    def __str__(self) -> str:
        return orjson.dumps(self.to_json()).decode()

    @classmethod
    def parse(cls, value: "str | bytes | dict[str, Any] | Cursor | None") -> "Cursor":
        """A cursor from its string (as printed by `tail` and `str(cursor)`), dict, or None."""
        if value is None:
            return cls()
        if isinstance(value, Cursor):
            return value
        data = value
        if isinstance(value, (str, bytes)):
            try:
                data = orjson.loads(value)
            except orjson.JSONDecodeError:
                raise CursorError(
                    f"cursor {str(value)[:80]!r} is not JSON: pass the value printed as `cursor: ...` "
                    f"by `hpc-rollout tail` or str(reader.cursor)"
                ) from None
        try:
            if not isinstance(data, dict) or data.get("v") != FORMAT:
                raise ValueError(f"expected an object with \"v\": {FORMAT}")
            next_seq = {str(w): int(s) for w, s in data.get("next", {}).items()}
            held = {
                str(w): {int(s): tuple((int(a), int(b)) for a, b in spans) for s, spans in by_seq.items()}
                for w, by_seq in data.get("held", {}).items()
            }
        except (ValueError, TypeError, AttributeError) as exc:
            raise CursorError(f"cursor is malformed ({exc}); start without one to read from the beginning") from None
        if any(s < 1 for s in next_seq.values()):
            raise CursorError("cursor is malformed: shard sequence numbers start at 1")
        return cls(next_seq, held)


def _ranges(indices: list[int]) -> tuple[tuple[int, int], ...]:
    spans: list[tuple[int, int]] = []
    for index in indices:
        if spans and spans[-1][1] == index:
            spans[-1] = (spans[-1][0], index + 1)
        else:
            spans.append((index, index + 1))
    return tuple(spans)

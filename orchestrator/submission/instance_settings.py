"""`submit --set KEY.PATH=VALUE`: one field set in every task's instance, e.g.
`--set harness.command="mini ..."` or `--set harness.max_calls=10`.

A VALUE that reads as JSON (a number, true/false, a list, an object, a quoted string) is that
value; anything else is the string as written. The row's own fields lose to --set.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def parse_settings(pairs: Iterable[str]) -> list[tuple[list[str], Any]]:
    """('a.b=1', ...) -> [(['a', 'b'], 1), ...]; ValueError naming the malformed one."""
    settings = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        path = [part.strip() for part in key.split(".")]
        if not sep or not all(path):
            raise ValueError(f"--set {pair!r}: expected KEY.PATH=VALUE, e.g. harness.command='mini ...'")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        settings.append((path, value))
    return settings


def apply_settings(rows: Iterable[tuple[int, Any]], settings: list[tuple[list[str], Any]]) -> Iterator[tuple[int, Any]]:
    """Rows as read by `read_rows`, each instance with the settings applied (others pass as is)."""
    for line, row in rows:
        if settings and isinstance(row, dict):
            instance = row["instance"] if isinstance(row.get("instance"), dict) and "handler" in row else row
            for path, value in settings:
                target = instance
                for part in path[:-1]:
                    if not isinstance(target.get(part), dict):
                        target[part] = {}
                    target = target[part]
                target[path[-1]] = value
        yield line, row

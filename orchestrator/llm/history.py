"""backends/history.jsonl: every change of the backend registry, one JSON line each, for reports.

`backends.json` holds only the present; this log keeps when a backend was added, removed,
marked down or up, and when its policy version changed (a swap). Registry writers append
to it while they hold the registry lock, so its lines are in the order of the changes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths


def changes(before: Any, after: Any, at: float) -> list[dict[str, Any]]:
    """Lines describing how registry snapshot `before` became `after` (orchestrator.llm.registry.Snapshot)."""
    old = {b.url: b for b in before.backends}
    new = {b.url: b for b in after.backends}
    lines: list[dict[str, Any]] = []
    for url, backend in new.items():
        common = {"t": at, "url": url, "state": backend.state.value, "policy_version": backend.policy_version,
                  "model": backend.model, "node": backend.node}
        previous = old.get(url)
        if previous is None:
            lines.append({**common, "change": "added"})
            continue
        if previous.policy_version != backend.policy_version:
            lines.append({**common, "change": "version", "from_version": previous.policy_version})
        if previous.state is not backend.state:
            lines.append({**common, "change": "state", "from_state": previous.state.value, "reason": backend.reason})
    for url, backend in old.items():
        if url not in new:
            lines.append({"t": at, "url": url, "change": "removed", "state": backend.state.value,
                          "policy_version": backend.policy_version, "model": backend.model, "node": backend.node})
    return lines


def append_changes(paths: SpoolPaths, before: Any, after: Any) -> None:
    lines = changes(before, after, time.time())
    if not lines:
        return
    path = paths.backends_history
    fsops.create_dirs(path.parent)
    with os.fdopen(fsops.open_append(path), "ab", buffering=0) as handle:  # one write: readers never see half a change
        handle.write(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def read_history(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(changes in file order, lines that could not be parsed); ([], 0) when there is no log."""
    try:
        raw = fsops.read_bytes(path, fsops.TICKET_READ_LIMIT)
    except FileNotFoundError:
        return [], 0
    found, bad = [], 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            found.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            bad += 1
    return found, bad

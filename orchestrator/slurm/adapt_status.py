"""The Slurm part of `status`: tasks still waiting for a node (and Slurm's reason), adapt's state.

Kept apart from the rest of `status`: it asks squeue once for the run's launched arrays and
reads the adapt controllers' small state files (control/adapt-KIND.json); nothing else.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.adapt import read_states
from orchestrator.slurm.cluster import slurm_available
from orchestrator.slurm.errors import SlurmUnavailable
from orchestrator.slurm.launcher import launched_arrays
from orchestrator.slurm.queries import queued_tasks

DECISIONS_SHOWN = 5
STALE_AFTER_INTERVALS = 3


def slurm_section(paths: SpoolPaths) -> dict[str, Any]:
    """{"pending": {reason: [task, ...]}, "adapt": [controller state, ...]} (empty parts left out)."""
    section: dict[str, Any] = {}
    arrays = launched_arrays(paths)
    if arrays and slurm_available():
        pending: dict[str, list[str]] = defaultdict(list)
        try:
            for task, state in sorted(queued_tasks(arrays).items()):
                if state.state == "PENDING":
                    pending[state.reason or "unknown"].append(task)
        except SlurmUnavailable as exc:
            section["error"] = str(exc)
        if pending:
            section["pending"] = dict(pending)
    states = read_states(paths)
    if states:
        section["adapt"] = states
    return section


def slurm_section_lines(section: dict[str, Any], now: float | None = None) -> list[str]:
    """What `status` prints for `slurm_section`: one line per fact, decisions indented."""
    now = time.time() if now is None else now
    lines = []
    pending = section.get("pending", {})
    if pending:
        total = sum(len(tasks) for tasks in pending.values())
        why = ", ".join(f"{reason}: {len(tasks)}" for reason, tasks in sorted(pending.items()))
        shown = " ".join(t for tasks in pending.values() for t in tasks[:4])
        lines.append(f"Slurm tasks pending: {total} ({why})  {shown}")
    if section.get("error"):
        lines.append(f"Slurm did not answer: {section['error']}")
    for state in section.get("adapt", []):
        age = now - float(state.get("updated_at", 0))
        stale = age > STALE_AFTER_INTERVALS * float(state.get("interval_s", 10))
        lines.append(
            f"adapt {state.get('kind')} workers: target {state.get('target')} (min {state.get('min')}, max {state.get('max')}); "
            f"running {state.get('running')}, pending {state.get('pending')}, backlog {state.get('backlog')} job(s); "
            f"controller {state.get('holder')}, {age:.0f}s ago" + (" (stale: no controller is running)" if stale else "")
        )
        for decision in state.get("decisions", [])[-DECISIONS_SHOWN:]:
            when = time.strftime("%H:%M:%S", time.localtime(float(decision.get("t", 0))))
            count = f" {decision['count']}" if decision.get("count") else ""
            error = f"  [failed: {decision['error']}]" if decision.get("error") else ""
            lines.append(f"  {when} {decision.get('action')}{count} -> target {decision.get('target')}: {decision.get('reason')}{error}")
    return lines

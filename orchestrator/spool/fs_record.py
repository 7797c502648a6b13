"""What `hpc-rollout doctor` measured of the run's filesystem (control/filesystem.json), and the
lease it allows.

A judge of liveness sees a healthy worker's heartbeat unchanged for up to a beat plus the time
its filesystem client takes to show a file rewritten on another node; the lease must leave that
twice over (`required_lease_s`). `launch` and every worker refuse a shorter lease once a
measurement is recorded (`check_lease`), naming the setting and the value that would do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from orchestrator.config import ConfigError, Leases
from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

RECORD = "filesystem.json"
LEASE_DELAY = "visible_change_s"   # a file replaced on one node (a heartbeat), seen changed on another


def required_lease_s(heartbeat_s: float, delay_s: float) -> float:
    # Rounded up to a tenth: a recommendation rounded down would be refused by `check_lease`.
    return math.ceil(round(20 * (heartbeat_s + delay_s), 6)) / 10


def write(paths: SpoolPaths, record: dict[str, Any]) -> Path:
    path = paths.control / RECORD
    fsops.write_atomic(path, json.dumps(record, indent=2).encode(), paths.tmp, fsops.Durability.FULL)
    return path


def recorded_delay_s(paths: SpoolPaths) -> float | None:
    """The heartbeat delay measured on this run's filesystem, if it was measured."""
    try:
        delay = json.loads(fsops.read_bytes(paths.control / RECORD))["delays_s"][LEASE_DELAY]
        return float(delay) if delay is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_lease(paths: SpoolPaths, leases: Leases) -> None:
    """ConfigError when run.toml's lease is shorter than the recorded delay allows."""
    delay = recorded_delay_s(paths)
    if delay is None:
        return
    needed = required_lease_s(leases.heartbeat_s, delay)
    if leases.lease_s < needed:
        raise ConfigError(
            f"leases.lease_s = {leases.lease_s:g} is too short for this filesystem: `hpc-rollout doctor` measured that "
            f"another node sees a rewritten heartbeat {delay:.2f} s late ({paths.control / RECORD}), so a judge could "
            f"take a healthy worker for dead; set it to at least {needed:g} (`hpc-rollout init {paths.root} --set "
            f"leases.lease_s={needed:g}`), or measure again (`hpc-rollout doctor {paths.root} --nodes 2`)")

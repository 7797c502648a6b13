"""From the agents' figures to a verdict per property, the settings to use, and the record
(orchestrator/spool/fs_record.py: what `launch` and the workers hold the lease to)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import Leases
from orchestrator.spool import fs_record
from orchestrator.spool.fs_record import LEASE_DELAY, required_lease_s
from orchestrator.spool.paths import SpoolPaths

CLOCK_SKEW_WARN_S = 2.0     # as `status` warns (docs/robustness.md)
# A name another node created, found once its directory is opened (stop, shards).
NAME_DELAY = "visible_create_after_opendir_s"


@dataclass(frozen=True)
class Verdict:
    name: str
    ok: bool
    detail: str


def verdicts(results: dict[str, Any], same_host: bool) -> list[Verdict]:
    found = [
        _race("atomic rename (claims)", results["rename_race"]),
        _race("exclusive create (leases, tokens)", results["exclusive_create"]),
        _race("rename onto a non-empty directory fails (locks)", results["directory_lock"]),
    ]
    flushes = results["link_and_fsync"]
    for key, name in (("link", "link()"), ("fsync_file", "fsync of a file"), ("fsync_dir", "fsync of a directory")):
        found.append(Verdict(name, flushes.get(key) == "ok", flushes.get(key, "not measured")))
    for key, name in (("visible_create_s", "a new name it looked up before (negative lookup cache)"),
                      (NAME_DELAY, "a new name, its directory opened first (what the spool does)"),
                      ("visible_rename_s", "a rename"), ("visible_unlink_s", "an unlink"),
                      (LEASE_DELAY, "a file replaced (a heartbeat)")):
        delay = results.get(key)
        found.append(Verdict(f"seen by the other agent: {name}", delay is not None,
                             f"{delay:.2f} s" if delay is not None else "not seen within 90 s"))
    torn = results["torn_reads"]
    found.append(Verdict("reads of a file renamed over", torn.get("new_content_after_s") is not None,
                         f"{torn.get('torn', 0)} torn, {torn.get('old_content', 0)} old before the new content "
                         f"({torn.get('new_content_after_s')} s); the spool parses files it renamed into place itself "
                         f"or saw change (docs/robustness.md)"))
    offset = results.get("clock_offset_s")
    if not same_host and offset is not None:
        found.append(Verdict("clock offset between the nodes", abs(offset) < CLOCK_SKEW_WARN_S,
                             f"{offset:+.3f} s (leases never compare clocks; `status` warns from "
                             f"{CLOCK_SKEW_WARN_S:g} s)"))
    return found


def _race(name: str, race: dict[str, Any]) -> Verdict:
    return Verdict(name, bool(race.get("ok")),
                   f"{race.get('tries')} races: {race.get('won_by_both')} won by both, {race.get('won_by_none')} by none")


def recommendation(results: dict[str, Any], leases: Leases) -> dict[str, float]:
    delay = float(results.get(LEASE_DELAY) or 0.0)
    return {"heartbeat_s": leases.heartbeat_s, "lease_s": max(leases.lease_s, required_lease_s(leases.heartbeat_s, delay)),
            "visibility_s": delay}


def filesystem_type(path: Path) -> str:
    """The type of the mount holding `path` (the longest mount point above it)."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/")) \
                and len(parts[1]) >= len(best):
            best, kind = parts[1], parts[2]
    return kind


def write_record(paths: SpoolPaths, results: dict[str, Any], hosts: list[str], fstype: str) -> Path:
    return fs_record.write(paths, {
        "measured_at": round(time.time(), 3), "hosts": hosts, "filesystem": fstype,
        "delays_s": {key: results.get(key) for key in results if key.startswith("visible_")},
        "clock_offset_s": results.get("clock_offset_s"), "torn_reads": results.get("torn_reads")})

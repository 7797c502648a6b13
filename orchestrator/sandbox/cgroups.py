"""A pids cgroup per sandbox, when this process may create one (typically root).

RLIMIT_NPROC does not bind processes whose host uid is root, so a fork bomb in a sandbox
started by root needs a pids cgroup. Non-root users usually cannot write cgroups: they
rely on RLIMIT_NPROC, which the kernel counts per user namespace and therefore per sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path

V1_PIDS = Path("/sys/fs/cgroup/pids")
V2_ROOT = Path("/sys/fs/cgroup")
GROUP = "hpc-rollout"


def _parent() -> Path | None:
    if V1_PIDS.is_dir() and os.access(V1_PIDS, os.W_OK):
        parent = V1_PIDS / GROUP
        parent.mkdir(exist_ok=True)
        return parent
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.is_file() and "pids" in controllers.read_text().split():
        if not os.access(V2_ROOT, os.W_OK):
            return None
        parent = V2_ROOT / GROUP
        parent.mkdir(exist_ok=True)
        try:
            (V2_ROOT / "cgroup.subtree_control").write_text("+pids")
            (parent / "cgroup.subtree_control").write_text("+pids")
        except OSError:
            return None
        return parent
    return None


def create(sandbox_id: str, max_pids: int) -> Path | None:
    """A cgroup limited to `max_pids` processes, or None when cgroups are not available."""
    try:
        parent = _parent()
        if parent is None:
            return None
        path = parent / sandbox_id
        path.mkdir(exist_ok=True)
        (path / "pids.max").write_text(str(max_pids))
        return path
    except OSError:
        return None


def procs_file(path: Path | None) -> str | None:
    return None if path is None else str(path / "cgroup.procs")


def joining_argv(procs: str, argv: list[str]) -> list[str]:
    """Wrap `argv` so that the process joins the cgroup before exec (inherited by all).

    A shell does the write, instead of a preexec_fn: preexec_fn forces a full fork() of
    the (large) worker process, while a plain command can use vfork().
    """
    return ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', procs, *argv]


def remove(path: str | Path | None) -> bool:
    """rmdir the cgroup; fails (False) while processes remain in it."""
    if not path:
        return True
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def pids_in(path: str | Path | None) -> list[int]:
    if not path:
        return []
    try:
        return [int(x) for x in (Path(path) / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def is_ours(path: str | Path, sandbox_id: str) -> bool:
    """Whether `path` is the cgroup this code makes for `sandbox_id` (what a record may name)."""
    candidate = Path(path)
    return candidate.name == sandbox_id and candidate.parent in (V1_PIDS / GROUP, V2_ROOT / GROUP)


def stale_groups(live_ids: set[str]) -> list[Path]:
    """Our cgroups whose sandbox no longer has a runtime directory."""
    found: list[Path] = []
    for root in (V1_PIDS / GROUP, V2_ROOT / GROUP):
        if root.is_dir():
            found += [p for p in root.iterdir() if p.is_dir() and p.name not in live_ids]
    return found

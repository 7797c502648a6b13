"""Per-sandbox cgroups for the totals rlimits cannot give: processes and memory of the whole sandbox.

RLIMIT_NPROC does not bind processes whose host uid is root, and RLIMIT_AS caps each process,
not their sum; a cgroup caps the sandbox as a whole (`pids.max`, `memory.max` / v1
`memory.limit_in_bytes`, swap included where the kernel accounts it). Creating one needs a
writable cgroup hierarchy, typically root; other users fall back to rlimits (see limits.py).

v1 has one hierarchy per controller (pids/, memory/), so a sandbox may be in two groups; v2 has
one group with both controllers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1_PIDS = ROOT / "pids"
V1_MEMORY = ROOT / "memory"
V2_ROOT = ROOT
GROUP = "hpc-rollout"


@dataclass(frozen=True)
class SandboxGroups:
    """The cgroup(s) of one sandbox: `pids` always, `memory` when memory is capped by one."""

    pids: Path
    memory: Path | None

    def paths(self) -> list[Path]:
        return [self.pids] + ([self.memory] if self.memory is not None and self.memory != self.pids else [])


def _v1_parent(controller_root: Path) -> Path | None:
    if controller_root.is_dir() and os.access(controller_root, os.W_OK):
        parent = controller_root / GROUP
        parent.mkdir(exist_ok=True)
        return parent
    return None


def _v2_parent(controller: str) -> Path | None:
    controllers = V2_ROOT / "cgroup.controllers"
    if not controllers.is_file() or controller not in controllers.read_text().split():
        return None
    if not os.access(V2_ROOT, os.W_OK):
        return None
    parent = V2_ROOT / GROUP
    parent.mkdir(exist_ok=True)
    try:
        (V2_ROOT / "cgroup.subtree_control").write_text(f"+{controller}")
        (parent / "cgroup.subtree_control").write_text(f"+{controller}")
    except OSError:
        return None
    return parent


def _parent(controller: str) -> Path | None:
    return _v1_parent(ROOT / controller) or _v2_parent(controller)


def memory_available() -> bool:
    """Whether this process can cap a sandbox's total memory with a cgroup."""
    try:
        return _parent("memory") is not None
    except OSError:
        return False


def create(sandbox_id: str, max_pids: int, memory_bytes: int | None = None) -> SandboxGroups | None:
    """Groups limited to `max_pids` processes (and `memory_bytes`), or None without cgroups.

    Memory is capped only when `memory_bytes` is given and a memory hierarchy is writable.
    """
    try:
        pids_parent = _parent("pids")
        if pids_parent is None:
            return None
        pids = pids_parent / sandbox_id
        pids.mkdir(exist_ok=True)
        (pids / "pids.max").write_text(str(max_pids))
        memory = _memory_group(sandbox_id, memory_bytes) if memory_bytes else None
        return SandboxGroups(pids, memory)
    except OSError:
        return None


def _memory_group(sandbox_id: str, memory_bytes: int) -> Path | None:
    parent = _parent("memory")
    if parent is None:
        return None
    group = parent / sandbox_id
    group.mkdir(exist_ok=True)
    if (group / "memory.max").exists():              # v2
        (group / "memory.max").write_text(str(memory_bytes))
        _write_if_present(group / "memory.swap.max", "0")
    else:                                            # v1: memory, then memory + swap
        (group / "memory.limit_in_bytes").write_text(str(memory_bytes))
        _write_if_present(group / "memory.memsw.limit_in_bytes", str(memory_bytes))
    return group


def _write_if_present(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:  # swap accounting is off on this kernel: memory alone is capped
        pass


def procs_files(groups: SandboxGroups | None) -> list[str]:
    return [] if groups is None else [str(path / "cgroup.procs") for path in groups.paths()]


def joining_argv(procs: list[str], argv: list[str]) -> list[str]:
    """Wrap `argv` so that the process joins the cgroups before exec (inherited by all).

    A shell does the write, instead of a preexec_fn: preexec_fn forces a full fork() of
    the (large) worker process, while a plain command can use vfork().
    """
    script = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *procs, "--", *argv]


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
    """Whether `path` is a cgroup this code makes for `sandbox_id` (what a record may name)."""
    candidate = Path(path)
    return candidate.name == sandbox_id and candidate.parent in (V1_PIDS / GROUP, V1_MEMORY / GROUP, V2_ROOT / GROUP)


def stale_groups(live_ids: set[str]) -> list[Path]:
    """Our cgroups whose sandbox no longer has a runtime directory."""
    found: list[Path] = []
    for root in (V1_PIDS / GROUP, V1_MEMORY / GROUP, V2_ROOT / GROUP):
        if root.is_dir():
            found += [p for p in root.iterdir() if p.is_dir() and p.name not in live_ids]
    return found

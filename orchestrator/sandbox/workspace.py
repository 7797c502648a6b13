"""Where a sandbox's /workspace lives, and how a kept one is copied out.

bubblewrap: /workspace is a tmpfs of `workspace_mb` inside the sandbox: the kernel enforces the
size, nothing reaches the shared filesystem, every sandbox (every retry) starts empty, and it
is gone when the sandbox closes. Kept on request (`keep_workspace`, run.toml
`sandbox.keep_workspaces`): copied to <job dir>/workspace-kept.<sandbox id> at close.

Apptainer and `local` bind a host directory instead, <job dir>/workspace.<sandbox id>: fresh per
sandbox, removed by the worker once the job's row is committed (unless kept). An explicit
`workspace=DIR` is the caller's: bound as is, never removed.

The copy-out reads the live sandbox's tmpfs through /proc/PID/root. The agent controls what is
there, so nothing is followed: each step opens relative to its parent with O_NOFOLLOW, links
are copied as links, anything but files, directories and links is skipped, and the copy stops
at the workspace's own size cap (hard links could otherwise multiply it).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from orchestrator.spool.paths import SpoolPaths

log = logging.getLogger(__name__)

KEPT_PREFIX = "workspace-kept."
REMOVABLE_PREFIX = "workspace."
MAX_ENTRIES = 200_000
CHUNK = 1 << 20


def host_workspace(paths: SpoolPaths, job_id: str, sandbox_id: str, keep: bool) -> Path:
    """A fresh host directory for one sandbox's workspace (runtimes without a tmpfs of their own)."""
    return paths.make_job_dir(job_id) / f"{KEPT_PREFIX if keep else REMOVABLE_PREFIX}{sandbox_id}"


def kept_copy(paths: SpoolPaths, job_id: str, sandbox_id: str) -> Path:
    return paths.make_job_dir(job_id) / f"{KEPT_PREFIX}{sandbox_id}"


def removable_workspaces(job_dir: Path) -> list[Path]:
    """Host workspaces of a finished job that nobody asked to keep (every attempt's); none when
    `job_dir` is no real directory (a planted link is not followed into its target)."""
    try:
        directory = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:   # gone, or a link / file planted in its place
        return []
    try:
        return [job_dir / name for name in os.listdir(directory) if name.startswith(REMOVABLE_PREFIX)]
    finally:
        os.close(directory)


@dataclass(frozen=True)
class CopyReport:
    files: int
    bytes: int
    skipped: int
    truncated: bool


def copy_out(source: Path, target: Path, max_bytes: int) -> CopyReport:
    """Copy the tree at `source` (following nothing) into the new directory `target`."""
    target.mkdir(parents=True)
    counts = {"files": 0, "bytes": 0, "skipped": 0, "entries": 0}
    root = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        truncated = not _copy_dir(root, target, max_bytes, counts)
    finally:
        os.close(root)
    if truncated:
        log.warning("kept workspace %s truncated at %d bytes / %d entries", target, max_bytes, MAX_ENTRIES)
    return CopyReport(counts["files"], counts["bytes"], counts["skipped"], truncated)


def _copy_dir(dir_fd: int, target: Path, max_bytes: int, counts: dict[str, int]) -> bool:
    """Copy the entries of the open directory `dir_fd` into `target`; False once the cap is hit."""
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            counts["entries"] += 1
            if counts["entries"] > MAX_ENTRIES:
                return False
            info = entry.stat(follow_symlinks=False)
            destination = target / entry.name
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(entry.name, dir_fd=dir_fd), destination)
            elif stat.S_ISDIR(info.st_mode):
                child = _open_nofollow(entry.name, dir_fd, os.O_DIRECTORY)
                if child is None:
                    counts["skipped"] += 1
                    continue
                try:
                    destination.mkdir()
                    if not _copy_dir(child, destination, max_bytes, counts):
                        return False
                finally:
                    os.close(child)
            elif stat.S_ISREG(info.st_mode):
                if not _copy_file(entry.name, dir_fd, destination, max_bytes, counts):
                    return False
            else:
                counts["skipped"] += 1  # fifos, sockets, devices: never opened
    return True


def _copy_file(name: str, dir_fd: int, destination: Path, max_bytes: int, counts: dict[str, int]) -> bool:
    source = _open_nofollow(name, dir_fd, os.O_NONBLOCK)
    if source is None:
        counts["skipped"] += 1
        return True
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):  # swapped for something else meanwhile
            counts["skipped"] += 1
            return True
        with open(destination, "xb") as out:
            while True:
                chunk = os.read(source, CHUNK)
                if not chunk:
                    break
                room = max_bytes - counts["bytes"]
                out.write(chunk[:room])
                counts["bytes"] += min(len(chunk), room)
                if len(chunk) > room:
                    return False
        counts["files"] += 1
        return True
    finally:
        os.close(source)


def _open_nofollow(name: str, dir_fd: int, flags: int) -> int | None:
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | flags, dir_fd=dir_fd)
    except OSError:
        return None

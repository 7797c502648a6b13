"""Node-local runtime directories and the record of each live sandbox.

    /tmp/hpc-rollout-<uid>/sb/<id>/record.json   who owns it, its pids, secret, lease
    /tmp/hpc-rollout-<uid>/sb/<id>/s/sock        the execution server's socket (bound inside)
    /tmp/hpc-rollout-<uid>/sb/<id>/server.log    the server's stderr

Node-local (never the shared filesystem): sockets do not work across nodes, and socket paths
are limited to 108 bytes. Override the base with HPC_ROLLOUT_RUNTIME_DIR.

Never trust a file you did not create: /tmp is shared with every user of the node, and the
sweep kills the processes and removes the directories records name. So the base, sb/ and each
sandbox directory must be directories (not links) owned by this user with mode 0700, and a
record must be a regular file owned by this user, readable by nobody else, naming its own
directory; anything else is refused (the base) or ignored (a sandbox directory).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import HpcRolloutError
from orchestrator.spool import fsops
from orchestrator.sandbox import cgroups
from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.procs import ProcessId

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL


def untrusted_because(path: Path, directory: bool = True) -> str | None:
    """Why `path` is not ours alone (None when it is): not ours, open to others, or not what it claims."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "it does not exist"
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not kind_ok:
        return f"it is not a {'directory' if directory else 'regular file'} (a symbolic link?)"
    if info.st_uid != os.getuid():
        return f"it is owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    if info.st_mode & 0o077:
        return f"its mode is {oct(info.st_mode & 0o777)}, not {'0o700' if directory else '0o600'}"
    return None


def private_dir(path: Path, parents: bool = False) -> Path:
    """`path` as a directory only this user can enter, created if missing; else SandboxConfigError."""
    path.mkdir(mode=0o700, parents=parents, exist_ok=True)
    problem = untrusted_because(path)
    if problem is not None:
        raise SandboxConfigError(
            f"refusing to use {path}: {problem}. Another user may have created it to tamper with your "
            "sandboxes: remove it, or set HPC_ROLLOUT_RUNTIME_DIR to a directory of your own"
        )
    return path


def runtime_base() -> Path:
    override = os.environ.get("HPC_ROLLOUT_RUNTIME_DIR")
    base = Path(override) if override else Path("/tmp") / f"hpc-rollout-{os.getuid()}"
    return private_dir(base, parents=True)


def sandboxes_dir() -> Path:
    return private_dir(runtime_base() / "sb")


def new_sandbox_dir() -> tuple[str, Path]:
    """A fresh private directory for one sandbox: (id, path)."""
    parent = sandboxes_dir()
    while True:
        sandbox_id = secrets.token_hex(6)
        path = parent / sandbox_id
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        (path / "s").mkdir(mode=0o700)
        socket = path / "s" / "sock"
        if len(str(socket).encode()) > SOCKET_PATH_MAX:
            shutil.rmtree(path, ignore_errors=True)
            raise SandboxConfigError(
                f"socket path {socket} is longer than {SOCKET_PATH_MAX} bytes; set "
                "HPC_ROLLOUT_RUNTIME_DIR to a short node-local directory such as /tmp/hr"
            )
        return sandbox_id, path


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    kind: str
    job_id: str
    node: str
    runtime_dir: str
    socket: str
    secret: str
    owner: list[int]             # ProcessId of the worker that started it
    process: list[int]           # ProcessId of the outer runtime process (bwrap, apptainer...)
    child: list[int] | None      # bwrap's pid 1 inside the sandbox (from --json-status-fd)
    loopback: str | None
    cgroup: str | None
    deadline: float              # time.time() after which the sandbox must be gone
    workspace: str               # host directory bound at /workspace; "" for an in-sandbox tmpfs
    memory_cgroup: str | None = None   # cgroup v1 keeps memory in a hierarchy of its own
    workspace_keep: str = ""     # where the tmpfs workspace is copied at close, when kept
    workspace_mb: int = 0        # size of the tmpfs workspace (the copy's cap)

    @property
    def path(self) -> Path:
        return Path(self.runtime_dir) / "record.json"

    def owner_process(self) -> ProcessId:
        return ProcessId(*self.owner)

    def cgroup_paths(self) -> list[str]:
        return [group for group in (self.cgroup, self.memory_cgroup) if group]

    def processes(self) -> list[ProcessId]:
        found = [ProcessId(*self.process)]
        if self.child:
            found.insert(0, ProcessId(*self.child))
        return found

    def save(self) -> None:
        # Node-local /tmp, rewritten at each change of the sandbox: no flush needed.
        fsops.write_atomic(self.path, json.dumps(asdict(self)).encode(),
                           durability=fsops.Durability.NONE, mode=0o600)

    @classmethod
    def load(cls, runtime_dir: str | Path) -> "SandboxRecord":
        """The record of a sandbox directory this user created; ValueError for anything else."""
        directory = Path(runtime_dir)
        for path, is_dir in ((directory, True), (directory / "record.json", False)):
            problem = untrusted_because(path, directory=is_dir)
            if problem is not None:
                raise UntrustedRecord(f"{path}: {problem}")
        with open(directory / "record.json") as fh:
            data: dict[str, Any] = json.load(fh)
        record = cls(**data)
        if Path(record.runtime_dir) != directory.absolute() or record.id != directory.name:
            raise UntrustedRecord(f"{directory}/record.json names {record.runtime_dir!r} (id {record.id!r}), not itself")
        for group in record.cgroup_paths():
            if not cgroups.is_ours(group, record.id):
                raise UntrustedRecord(f"{directory}/record.json names cgroup {group}, not one of this sandbox's")
        return record


class UntrustedRecord(HpcRolloutError, ValueError):
    """A sandbox directory or record this user did not create (or that points elsewhere)."""


def remove_sandbox_dir(path: str | Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

"""Node-local runtime directories and the record of each live sandbox.

    /tmp/hpc-rollout-<uid>/sb/<id>/record.json   who owns it, its pids, secret, lease
    /tmp/hpc-rollout-<uid>/sb/<id>/s/sock        the execution server's socket (bound inside)
    /tmp/hpc-rollout-<uid>/sb/<id>/server.log    the server's stderr

Node-local (never the shared filesystem): sockets do not work across nodes, and socket paths
are limited to 108 bytes. Override the base with HPC_ROLLOUT_RUNTIME_DIR.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.procs import ProcessId

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL


def runtime_base() -> Path:
    override = os.environ.get("HPC_ROLLOUT_RUNTIME_DIR")
    base = Path(override) if override else Path("/tmp") / f"hpc-rollout-{os.getuid()}"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    return base


def sandboxes_dir() -> Path:
    path = runtime_base() / "sb"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


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
    workspace: str

    @property
    def path(self) -> Path:
        return Path(self.runtime_dir) / "record.json"

    def owner_process(self) -> ProcessId:
        return ProcessId(*self.owner)

    def processes(self) -> list[ProcessId]:
        found = [ProcessId(*self.process)]
        if self.child:
            found.insert(0, ProcessId(*self.child))
        return found

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(self), fh)
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, runtime_dir: str | Path) -> "SandboxRecord":
        with open(Path(runtime_dir) / "record.json") as fh:
            data: dict[str, Any] = json.load(fh)
        return cls(**data)


def remove_sandbox_dir(path: str | Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

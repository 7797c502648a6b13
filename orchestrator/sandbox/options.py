"""Options of one sandbox, parsed and bounded once, then frozen."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import DEFAULTS
from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.limits import Limits

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Paths reserved inside every sandbox.
WORKSPACE = "/workspace"
CONTROL_DIR = "/.hpc-rollout"


@dataclass(frozen=True)
class Bind:
    source: Path
    target: str
    read_only: bool = True

    @classmethod
    def parse(cls, value: "Bind | str | dict[str, Any]") -> "Bind":
        """`src:dst[:ro|rw]`, or {"source", "target", "read_only"}; read-only by default."""
        if isinstance(value, Bind):
            return value
        source, target, read_only = bind_parts(value)
        path = Path(source).absolute()
        if not path.exists():
            raise SandboxConfigError(f"bind source {path} does not exist; create it or fix the path")
        return cls(path, target, read_only)


def bind_parts(value: "Bind | str | dict[str, Any]") -> tuple[str, str, bool]:
    """(source, target, read_only) of a bind as written, checked for form only (not on disk)."""
    if isinstance(value, Bind):
        return str(value.source), value.target, value.read_only
    if isinstance(value, dict):
        source, target = value.get("source"), value.get("target", value.get("source"))
        read_only = bool(value.get("read_only", True))
    else:
        parts = str(value).split(":")
        if len(parts) not in (1, 2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise SandboxConfigError(f"bind {value!r} must look like SRC[:DST[:ro|rw]]")
        source = parts[0]
        target = parts[1] if len(parts) > 1 else parts[0]
        read_only = len(parts) < 3 or parts[2] == "ro"
    if not source or not target or not str(target).startswith("/"):
        raise SandboxConfigError(f"bind {value!r}: target must be an absolute path")
    if str(target).startswith(CONTROL_DIR):
        raise SandboxConfigError(f"bind {value!r}: {CONTROL_DIR} is reserved for the runtime")
    return str(source), str(target), read_only


@dataclass(frozen=True)
class SandboxOptions:
    image: Path | None = None
    network: bool = DEFAULTS.sandbox.network
    binds: tuple[Bind, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    limits: Limits = field(default_factory=Limits)
    fakeroot: bool = DEFAULTS.sandbox.fakeroot
    workspace: Path | None = None      # a host directory to bind; default: see workspace.py
    keep_workspace: bool = DEFAULTS.sandbox.keep_workspaces  # keep the workspace after the job (copied out at close)
    start_timeout_s: float = 30.0
    cgroup: bool = True                # use a cgroup for the process limit when one is writable

    @classmethod
    def parse(cls, **options: Any) -> "SandboxOptions":
        known = {
            "image", "network", "binds", "env", "limits", "fakeroot", "workspace", "keep_workspace",
            "start_timeout_s", "cgroup", "wall_clock_s", "command_timeout_s",
        }
        unknown = sorted(set(options) - known)
        if unknown:
            raise SandboxConfigError(
                f"unknown sandbox option(s) {unknown}; valid: {', '.join(sorted(known))}"
            )
        image = options.get("image")
        image_path = Path(image).absolute() if image else None
        if image_path is not None and not image_path.exists():
            raise SandboxConfigError(
                f"image {image_path} does not exist; build it with `hpc-rollout image build` "
                "or omit --image to use the host's /usr read-only (bubblewrap)"
            )
        env = dict(options.get("env") or {})
        for name in env:
            if not ENV_NAME.match(str(name)):
                raise SandboxConfigError(f"environment variable name {name!r} is not valid")
        limits = Limits.parse(
            options.get("limits"),
            wall_clock_s=options.get("wall_clock_s"),
            command_timeout_s=options.get("command_timeout_s"),
        )
        workspace = options.get("workspace")
        return cls(
            image=image_path,
            network=bool(options.get("network", False)),
            binds=tuple(Bind.parse(b) for b in options.get("binds") or ()),
            env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
            limits=limits,
            fakeroot=bool(options.get("fakeroot", False)),
            workspace=Path(workspace).absolute() if workspace else None,
            keep_workspace=bool(options.get("keep_workspace", False)),
            start_timeout_s=float(options.get("start_timeout_s", 30.0)),
            cgroup=bool(options.get("cgroup", True)),
        )

"""Options of one sandbox, parsed and bounded once, then frozen."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import DEFAULTS
from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.limits import Limits
from orchestrator.settings_spec import Family, Numbers, checked, setting

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


# A number as text too ("30"): what start_timeout_s always took.
OPTIONS = Family("sandbox option", "sandbox option {key}", SandboxConfigError, Numbers.TEXT, show_help=True)


@dataclass(frozen=True)
class SandboxRequest:
    """The options a sandbox is asked for, as written; `object` ones are read by SandboxOptions.parse
    (flags as bool(value), as ever) or, for the limits, by Limits.parse."""

    image: Any = setting(None, "an image directory or .sif (None: the host's /usr, bubblewrap)", kind=object)
    network: Any = setting(False, "network access", kind=object)
    binds: Any = setting(None, "SRC[:DST[:ro|rw]] or {source, target, read_only}, each", kind=object)
    env: Any = setting(None, "environment variables by name", kind=object)
    limits: Any = setting(None, "resource limits (orchestrator/sandbox/limits.py)", kind=object)
    fakeroot: Any = setting(False, "root inside the sandbox (user namespace)", kind=object)
    workspace: Any = setting(None, "a host directory bound as /workspace", kind=object)
    keep_workspace: Any = setting(False, "keep the workspace after the job", kind=object)
    start_timeout_s: float = setting(30.0, "seconds a sandbox may take to start", bounds=(0.001, 86400))
    cgroup: Any = setting(True, "use a cgroup for the process limit when one is writable", kind=object)
    wall_clock_s: Any = setting(None, "the limit of that name, over limits'", kind=object)
    command_timeout_s: Any = setting(None, "the limit of that name, over limits'", kind=object)


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
        asked = SandboxRequest(**checked(SandboxRequest, options, OPTIONS))
        image_path = Path(asked.image).absolute() if asked.image else None
        if image_path is not None and not image_path.exists():
            raise SandboxConfigError(
                f"image {image_path} does not exist; build it with `hpc-rollout image build` "
                "or omit --image to use the host's /usr read-only (bubblewrap)"
            )
        env = dict(asked.env or {})
        for name in env:
            if not ENV_NAME.match(str(name)):
                raise SandboxConfigError(f"environment variable name {name!r} is not valid")
        limits = Limits.parse(asked.limits, wall_clock_s=asked.wall_clock_s, command_timeout_s=asked.command_timeout_s)
        return cls(
            image=image_path,
            network=bool(asked.network),
            binds=tuple(Bind.parse(b) for b in asked.binds or ()),
            env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
            limits=limits,
            fakeroot=bool(asked.fakeroot),
            workspace=Path(asked.workspace).absolute() if asked.workspace else None,
            keep_workspace=bool(asked.keep_workspace),
            start_timeout_s=asked.start_timeout_s,
            cgroup=bool(asked.cgroup),
        )

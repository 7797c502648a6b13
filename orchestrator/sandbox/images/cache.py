"""Cache keys of built images and the decision of what to build.

Keys (as in the systems we compare against, with the ordering of reuse):
  versioned = hash(template, base image, framework version)
  lock      = hash(template, base image, dependency lock file)
  source    = hash(lock key, source tree)
Reuse order for a requested mode: the exact image > layer on the lock image > layer on the
versioned image > build from scratch. `scratch` never reuses anything.
"""

from __future__ import annotations

import enum
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


class Mode(str, enum.Enum):
    SCRATCH = "scratch"
    VERSIONED = "versioned"
    LOCK = "lock"
    SOURCE = "source"


class BuildAction(str, enum.Enum):
    REUSE = "reuse"
    FROM_LOCK = "from_lock"
    FROM_VERSIONED = "from_versioned"
    SCRATCH = "scratch"


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def base_identity(variables: dict[str, Any]) -> str:
    bootstrap = variables.get("bootstrap", "")
    if bootstrap == "docker":
        return f"docker:{variables.get('base_image')}"
    if bootstrap == "localimage":
        return f"localimage:{variables.get('from_image')}"
    return f"debootstrap:{variables.get('os_version')}:{variables.get('mirror')}"


def tree_digest(path: Path) -> str:
    """Hash of a file or a directory tree (names, modes and contents), for source keys."""
    h = hashlib.sha256()
    paths = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for item in paths:
        h.update(str(item.relative_to(path) if item != path else item.name).encode())
        h.update(oct(item.stat().st_mode & 0o777).encode())
        h.update(item.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class CacheKeys:
    template: str
    versioned: str
    lock: str | None
    source: str | None
    scratch: str

    @classmethod
    def compute(
        cls, template: str, variables: dict[str, Any], rendered_text: str,
        lock_text: str | None = None, source: Path | None = None,
    ) -> "CacheKeys":
        base = base_identity(variables)
        versioned = _digest(template, base, str(variables.get("framework_version", "")))
        lock = _digest(template, base, lock_text) if lock_text is not None else None
        source_key = _digest(lock or versioned, tree_digest(source)) if source is not None else None
        return cls(template, versioned, lock, source_key, _digest(rendered_text))

    def name(self, mode: Mode) -> str:
        key = {Mode.SCRATCH: self.scratch, Mode.VERSIONED: self.versioned,
               Mode.LOCK: self.lock, Mode.SOURCE: self.source}[mode]
        if key is None:
            needs = "--lock-file" if mode is Mode.LOCK else "--source"
            raise ValueError(f"mode {mode.value} needs {needs}")
        return f"{self.template}-{mode.value}-{key}"


@dataclass(frozen=True)
class BuildPlan:
    mode: Mode
    action: BuildAction
    target: Path
    base: Path | None = None      # the image layered on (FROM_LOCK / FROM_VERSIONED)


def plan_build(
    mode: Mode, keys: CacheKeys, out_dir: Path, suffix: str,
    exists: Callable[[Path], bool] = os.path.exists,
) -> BuildPlan:
    target = out_dir / (keys.name(mode) + suffix)
    if mode is Mode.SCRATCH:
        return BuildPlan(mode, BuildAction.SCRATCH, target)
    if exists(target):
        return BuildPlan(mode, BuildAction.REUSE, target)
    if mode is Mode.SOURCE and keys.lock is not None:
        lock_image = out_dir / (keys.name(Mode.LOCK) + suffix)
        if exists(lock_image):
            return BuildPlan(mode, BuildAction.FROM_LOCK, target, lock_image)
    if mode in (Mode.LOCK, Mode.SOURCE):
        versioned = out_dir / (keys.name(Mode.VERSIONED) + suffix)
        if exists(versioned):
            return BuildPlan(mode, BuildAction.FROM_VERSIONED, target, versioned)
    return BuildPlan(mode, BuildAction.SCRATCH, target)

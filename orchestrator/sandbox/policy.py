"""Operator policy, not row policy: what a job's sandbox may be is decided here, and only here.

run.toml `[sandbox]` gives the defaults every sandbox starts with (image, network, fakeroot,
totals) and what a job may ask for beyond them: images under `allowed_images`, read-only binds
from inside `allowed_binds`, read-write binds from inside `allowed_rw_binds` (and from the job's
own directory), the network for the handlers in `network_handlers` (every handler when
`network = true`), and limits up to the run's totals. A task row is data: it only chooses
among these. Defaults allow nothing more: no image but the run's (never the host's root), no
bind but read-write ones of the job's own directory, no network.

Every sandbox a job opens goes through `SandboxPolicy.decide` (JobContext.open_sandbox, and
fresh_sandbox for EVAL); `submit` asks the same of each row's `AgentHandler.sandbox_request`, so
a row the run would refuse is reported as FILE:LINE: reason before anything is queued, and a
worker asks again before INIT (a ticket planted without `submit`). What `decide` returns is what
starts: host paths resolved once, here (`..` and symbolic links cannot lead out of an allowed
directory after the check).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import DEFAULTS, Sandbox
from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.limits import Limits
from orchestrator.sandbox.options import bind_parts

# Limits a job may lower but not raise, and the run.toml setting each is held to.
CEILINGS = {"total_memory_mb": "total_memory_mb", "workspace_mb": "workspace_mb", "processes": "processes",
            # one process, or the private /tmp, can never need more than the whole sandbox
            "memory_mb": "total_memory_mb", "tmp_mb": "total_memory_mb"}


class SandboxPolicyError(SandboxConfigError):
    """A job asked for a sandbox the run's operator did not allow (the message says what and how)."""


def merge_sandbox_options(defaults: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A handler's options over the run's defaults; limits are merged key by key."""
    merged = {**defaults, **options}
    default_limits, own_limits = defaults.get("limits"), options.get("limits")
    if isinstance(default_limits, dict) and isinstance(own_limits, dict):
        merged["limits"] = {**default_limits, **own_limits}
    return merged


def _resolved(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(path))


def _inside(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _listing(roots: tuple[Path, ...]) -> str:
    return ", ".join(str(r) for r in roots) or "none"


@dataclass(frozen=True)
class SandboxPolicy:
    images: tuple[Path, ...] = ()           # resolved; an image must be one of them or lie inside one
    binds: tuple[Path, ...] = ()            # read-only bind sources must lie inside one (or inside rw_binds)
    rw_binds: tuple[Path, ...] = ()
    network: bool = DEFAULTS.sandbox.network   # the run's default: every handler may have the network
    network_handlers: frozenset[str] = frozenset()
    fakeroot: bool = DEFAULTS.sandbox.fakeroot
    # ceilings of a job's limits (see CEILINGS): the run's totals
    total_memory_mb: int = Sandbox.total_memory_mb
    workspace_mb: int = Sandbox.workspace_mb
    processes: int = Sandbox.processes

    @classmethod
    def of(cls, sandbox: Sandbox) -> "SandboxPolicy":
        """The policy of a run's `[sandbox]` settings (host paths resolved now)."""
        return cls(
            images=tuple(_resolved(p) for p in sandbox.allowed_images),
            binds=tuple(_resolved(p) for p in sandbox.allowed_binds),
            rw_binds=tuple(_resolved(p) for p in sandbox.allowed_rw_binds),
            network=sandbox.network, network_handlers=frozenset(sandbox.network_handlers),
            fakeroot=sandbox.fakeroot, total_memory_mb=sandbox.total_memory_mb,
            workspace_mb=sandbox.workspace_mb, processes=sandbox.processes,
        )

    @classmethod
    def of_settings(cls, **settings: Any) -> "SandboxPolicy":
        """The policy of `[sandbox]` with these settings (the others at their defaults)."""
        return cls.of(Sandbox(**settings))

    def decide(self, defaults: dict[str, Any], requested: dict[str, Any], *, handler: str,
               job_dir: Path | None = None) -> dict[str, Any]:
        """The options a sandbox starts with: `requested` (a handler's, maybe from its row) over the
        run's `defaults`, or SandboxPolicyError naming everything that is not allowed and how the
        operator would allow it. `job_dir` (the job's own directory, None at submit) may be bound
        read-write and hold the workspace."""
        merged = merge_sandbox_options(defaults, requested)
        if not requested:
            return merged
        problems: list[str] = []
        own = (_resolved(job_dir),) if job_dir is not None else ()
        image = requested.get("image")
        if not image or str(image) == str(defaults.get("image") or ""):
            merged["image"] = defaults.get("image")   # the operator's own image (or none)
            if merged["image"] is None:
                merged.pop("image")
        else:
            problem = self._image_problem(str(image), defaults.get("image"))
            if problem:
                problems.append(problem)
            else:
                merged["image"] = str(_resolved(str(image)))
        if requested.get("binds"):
            decided_binds, bind_problems = self._binds(requested["binds"], own)
            problems += bind_problems
            merged["binds"] = [*(defaults.get("binds") or []), *decided_binds]
        if requested.get("workspace"):
            workspace = _resolved(str(requested["workspace"]))
            if not _inside(workspace, own):
                problems.append(f"workspace {requested['workspace']} is outside the job's own directory "
                                f"({job_dir or 'jobs/XX/JOB'}): a job's workspace lives there")
            else:
                merged["workspace"] = str(workspace)
        if requested.get("network") and not defaults.get("network") and not self.network_allowed(handler):
            problems.append(f"network access is not allowed for handler {handler!r}: the operator grants it with "
                            f"run.toml [sandbox] sandbox.network_handlers = [\"{handler}\"] (or network = true for all)")
        if requested.get("fakeroot") and not defaults.get("fakeroot") and not self.fakeroot:
            problems.append("fakeroot is not allowed: the operator grants it with run.toml [sandbox] fakeroot = true")
        if "cgroup" in requested and not requested["cgroup"]:
            problems.append("a job may not turn its sandbox's cgroup off: the memory and process totals are the operator's")
        problems += self._limit_problems(requested)
        if problems:
            raise SandboxPolicyError("the run's sandbox policy refuses this job: " + "; ".join(problems))
        return merged

    def network_allowed(self, handler: str) -> bool:
        return self.network or handler in self.network_handlers

    def _image_problem(self, image: str, default: Any) -> str | None:
        resolved = _resolved(image)
        if _inside(resolved, self.images):
            return None
        what = ("is the host's root filesystem, never an image" if resolved == Path("/")
                else f"is not an image the operator allowed{'' if str(resolved) == image else f' (it is {resolved})'}")
        return (f"image {image} {what}: the run's image is {default or 'the host /usr, read-only'}; a job may "
                f"name only images inside run.toml [sandbox] sandbox.allowed_images ({_listing(self.images)})")

    def _binds(self, binds: Any, own: tuple[Path, ...]) -> tuple[list[dict[str, Any]], list[str]]:
        decided: list[dict[str, Any]] = []
        problems: list[str] = []
        if not isinstance(binds, (list, tuple)):
            return [], [f"binds must be a list of SRC:DST[:ro|rw], got {binds!r}"]
        for bind in binds:
            try:
                source, target, read_only = bind_parts(bind)
            except SandboxConfigError as exc:
                problems.append(str(exc))
                continue
            resolved = _resolved(source)
            if read_only and _inside(resolved, (*self.binds, *self.rw_binds, *own)):
                decided.append({"source": str(resolved), "target": target, "read_only": True})
            elif not read_only and _inside(resolved, (*self.rw_binds, *own)):
                decided.append({"source": str(resolved), "target": target, "read_only": False})
            elif read_only:
                problems.append(f"bind {source} is not allowed: a job may bind read-only only from inside run.toml "
                                f"[sandbox] sandbox.allowed_binds ({_listing(self.binds)}) or "
                                f"sandbox.allowed_rw_binds ({_listing(self.rw_binds)})")
            else:
                problems.append(f"read-write bind {source} is not allowed: a job may bind read-write only its own "
                                f"directory or from inside run.toml [sandbox] sandbox.allowed_rw_binds "
                                f"({_listing(self.rw_binds)})")
        return decided, problems

    def _limit_problems(self, requested: dict[str, Any]) -> list[str]:
        asked = requested.get("limits")
        if not asked and requested.get("wall_clock_s") is None and requested.get("command_timeout_s") is None:
            return []
        limits = Limits.parse(asked if isinstance(asked, dict) else None,
                              wall_clock_s=requested.get("wall_clock_s"),
                              command_timeout_s=requested.get("command_timeout_s"))
        problems = []
        for name, setting in CEILINGS.items():
            ceiling = getattr(self, setting)
            if isinstance(asked, dict) and name in asked and getattr(limits, name) > ceiling:
                problems.append(f"limit {name} = {getattr(limits, name)} is above the run's "
                                f"run.toml [sandbox] {setting} = {ceiling}")
        return problems

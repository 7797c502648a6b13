"""`hpc-rollout image build`: decide from the cache, lock, build under a temporary name, rename.

The lock (orchestrator/spool/lease.py) sits next to the images on the shared filesystem
(portable to NFS and Lustre, unlike flock), so eight nodes asking for one image build it once:
the others wait, then find it in the cache. The builder renews it while it builds, so a crashed
build's lock is broken after STALE_LOCK_S of silence, not after hours.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable


from orchestrator.sandbox.errors import SandboxConfigError, SandboxError
from orchestrator.sandbox.images.cache import BuildAction, BuildPlan, CacheKeys, Mode, plan_build
from orchestrator.sandbox.images.templates import Rendered, render
from orchestrator.spool.lease import Lock, LockTimeout, acquire

log = logging.getLogger(__name__)

# backend(rendered definition, definition file, temporary output path, plan)
Backend = Callable[[Rendered, Path, Path, BuildPlan], None]
FORMATS = ("sif", "dir")
STALE_LOCK_S = 120.0   # a build that stopped renewing its lock this long (as a waiter saw it) is dead
RENEW_LOCK_S = 10.0


class ImageBuildError(SandboxError):
    pass


@dataclass(frozen=True)
class BuildOutcome:
    plan: BuildPlan
    path: Path
    built: bool
    seconds: float
    definition: Path | None


def apptainer_backend(binary: str) -> Backend:
    def build(rendered: Rendered, definition: Path, output: Path, plan: BuildPlan) -> None:
        command = [binary, "build", "--fakeroot", str(output), str(definition)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageBuildError(
                f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}"
            )
    return build


def default_backend(fmt: str) -> Backend:
    if fmt == "dir":
        from orchestrator.sandbox.images.dirimage import build_dir_image

        return build_dir_image
    from orchestrator.sandbox.apptainer import find_apptainer

    binary = find_apptainer()
    if binary is None:
        raise SandboxConfigError(
            "building a .sif needs apptainer or singularity on PATH; on machines without "
            "it build a bubblewrap directory image instead: --format dir"
        )
    return apptainer_backend(binary)


def _definition_for(plan: BuildPlan, template: Path, variables: dict[str, Any],
                    source: Path | None) -> Rendered:
    if plan.action in (BuildAction.FROM_LOCK, BuildAction.FROM_VERSIONED):
        assert plan.base is not None
        variables = {**variables, "bootstrap": "localimage", "from_image": str(plan.base),
                     "layer_only": True}
        if plan.action is BuildAction.FROM_LOCK:
            variables["lock_text"] = ""   # the lock image already has the dependencies
    rendered = render(template, variables)
    if source is not None:
        rendered = replace(rendered, text=rendered.text.rstrip("\n") + f"\n\n%files\n    {source} /opt/src\n")
    return rendered


def _acquire(lock_path: Path, timeout: float) -> Lock:
    try:
        return acquire(lock_path, timeout, STALE_LOCK_S)
    except LockTimeout:
        raise ImageBuildError(
            f"another build holds {lock_path} for over {timeout:.0f} s; wait, or remove that "
            "directory if no build is running"
        ) from None


def build_image(
    template: Path, *, mode: Mode | str = Mode.VERSIONED, variables: dict[str, Any] | None = None,
    fmt: str = "sif", out_dir: Path, lock_file: Path | None = None, source: Path | None = None,
    backend: Backend | None = None, lock_timeout: float = 4 * 3600,
) -> BuildOutcome:
    mode = Mode(mode)
    if fmt not in FORMATS:
        raise SandboxConfigError(f"image format {fmt!r} unknown; choose one of {', '.join(FORMATS)}")
    if mode is Mode.LOCK and lock_file is None:
        raise SandboxConfigError("--mode lock needs --lock-file (e.g. requirements.lock)")
    if mode is Mode.SOURCE and source is None:
        raise SandboxConfigError("--mode source needs --source (a file or directory to bake in)")
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    lock_text = lock_file.read_text() if lock_file is not None else None
    variables = {**(variables or {}), "lock_text": lock_text or ""}
    full = render(template, variables)
    keys = CacheKeys.compute(full.name, full.variables, full.text, lock_text, source)
    suffix = ".sif" if fmt == "sif" else ""
    plan = plan_build(mode, keys, out_dir, suffix)
    if plan.action is BuildAction.REUSE:
        return BuildOutcome(plan, plan.target, False, time.monotonic() - started, None)
    build = backend or default_backend(fmt)
    lock = _acquire(out_dir / f".{plan.target.name}.lock", lock_timeout)
    try:
        with lock.renewed(RENEW_LOCK_S):
            return _build_locked(plan, mode, keys, out_dir, suffix, template, variables, source, build, started)
    finally:
        lock.release()


def _build_locked(plan: BuildPlan, mode: Mode, keys: CacheKeys, out_dir: Path, suffix: str, template: Path,
                  variables: dict[str, Any], source: Path | None, build: Backend, started: float) -> BuildOutcome:
    # Another node may have finished this image while we waited for the lock.
    plan = plan_build(mode, keys, out_dir, suffix)
    if plan.action is BuildAction.REUSE:
        return BuildOutcome(plan, plan.target, False, time.monotonic() - started, None)
    rendered = _definition_for(plan, template, variables, source)
    definition = out_dir / f"{plan.target.name}.def"
    definition.write_text(rendered.text)
    tmp = out_dir / f".{plan.target.name}.tmp-{socket.gethostname()}-{os.getpid()}"
    try:
        log.info("building %s (%s) from %s", plan.target, plan.action.value, template)
        build(rendered, definition, tmp, plan)
        if not tmp.exists():
            raise ImageBuildError(f"the build of {plan.target.name} produced nothing at {tmp}")
        if plan.action is BuildAction.SCRATCH and plan.target.exists():
            _remove(plan.target)   # scratch mode replaces an earlier scratch build
        os.rename(tmp, plan.target)
    finally:
        if tmp.exists():
            _remove(tmp)
    return BuildOutcome(plan, plan.target, True, time.monotonic() - started, definition)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

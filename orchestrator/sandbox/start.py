"""The sandbox API the rest of the system uses: start, attach, sweep."""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.spool.paths import SpoolPaths, current_node
from orchestrator.config import RUNTIME_NAMES, Runtime
from orchestrator.sandbox import apptainer
from orchestrator.sandbox.apptainer import ApptainerRuntime
from orchestrator.sandbox.base import Sandbox
from orchestrator.sandbox.bwrap import BwrapRuntime
from orchestrator.sandbox.errors import SandboxAttachError, SandboxConfigError
from orchestrator.sandbox.launch import launch
from orchestrator.sandbox.local import LocalRuntime
from orchestrator.sandbox.options import SandboxOptions
from orchestrator.sandbox.process import ProcessSandbox
from orchestrator.sandbox.records import SandboxRecord
from orchestrator.sandbox.runtime import SandboxRuntime
from orchestrator.sandbox.sweep import sweep_orphaned_sandboxes

log = logging.getLogger(__name__)

RUNTIMES = RUNTIME_NAMES

# The runtime registry: one class per name of orchestrator/config.py (Runtime) (`auto` picks one of them).
RUNTIME_CLASSES: dict[Runtime, type[SandboxRuntime]] = {
    runtime.name: runtime for runtime in (BwrapRuntime, ApptainerRuntime, LocalRuntime)
}

__all__ = ["RUNTIMES", "RUNTIME_CLASSES", "resolve_runtime", "start_sandbox", "attach_sandbox",
           "sweep_orphaned_sandboxes"]


def resolve_runtime(runtime: str) -> str:
    """`auto` is apptainer/singularity when on PATH, else bubblewrap."""
    if runtime not in RUNTIMES:
        raise SandboxConfigError(f"unknown sandbox runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if runtime == Runtime.AUTO:
        return Runtime.APPTAINER.value if apptainer.find_apptainer() else Runtime.BWRAP.value
    return runtime


async def start_sandbox(runtime: str, *, job_id: str, paths: SpoolPaths, **options: Any) -> Sandbox:
    """Start a sandbox for `job_id`; where its /workspace lives is said in workspace.py.

    options: image, network (False), binds, env, limits {memory_mb, total_memory_mb,
    workspace_mb, cpu_seconds, file_size_mb, processes, open_files, tmp_mb, wall_clock_s,
    command_timeout_s}, wall_clock_s, command_timeout_s, fakeroot, workspace, keep_workspace,
    start_timeout_s, cgroup.
    """
    chosen = RUNTIME_CLASSES[Runtime(resolve_runtime(runtime))](SandboxOptions.parse(**options))
    chosen.announce(job_id)
    return await launch(chosen, job_id=job_id, paths=paths)


async def attach_sandbox(descriptor: dict[str, Any]) -> Sandbox:
    """Re-attach to a sandbox started by another process on this node."""
    try:
        runtime_dir, node, sandbox_id = descriptor["runtime_dir"], descriptor["node"], descriptor["id"]
    except (KeyError, TypeError):
        raise SandboxAttachError(f"not a sandbox descriptor: {descriptor!r}") from None
    if node != current_node():
        raise SandboxAttachError(
            f"sandbox {sandbox_id} lives on node {node}, this is {current_node()}: RUN must "
            "claim from the run queue of the node where INIT started the sandbox"
        )
    try:
        record = SandboxRecord.load(runtime_dir)
    except (OSError, ValueError, TypeError):
        raise SandboxAttachError(
            f"sandbox {sandbox_id} has no record in {runtime_dir}: it was closed or reaped"
        ) from None
    sandbox = ProcessSandbox(record)
    if not sandbox.alive():
        raise SandboxAttachError(f"sandbox {sandbox_id}'s processes are gone (see {runtime_dir}/server.log)")
    return sandbox

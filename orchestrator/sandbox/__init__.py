"""Rootless sandboxes: Apptainer/Singularity, bubblewrap, and an explicit unsandboxed `local`.

    sandbox = await start_sandbox("auto", job_id=..., paths=..., network=False)
    result = await sandbox.bash("pytest -q")
    await sandbox.close()

One class per runtime (bwrap.BwrapRuntime, apptainer.ApptainerRuntime, local.LocalRuntime, on
runtime.SandboxRuntime) states how it differs; launch.py does the rest for all of them.

Host-side modules import nothing heavy at package import time: `server/` is also mounted
into sandboxes and must stay standard-library only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["start_sandbox", "attach_sandbox", "sweep_orphaned_sandboxes", "Sandbox"]


def __getattr__(name: str) -> Any:
    if name in ("start_sandbox", "attach_sandbox", "sweep_orphaned_sandboxes"):
        from orchestrator.sandbox import start as api

        return getattr(api, name)
    if name == "Sandbox":
        from orchestrator.sandbox.base import Sandbox

        return Sandbox
    raise AttributeError(name)

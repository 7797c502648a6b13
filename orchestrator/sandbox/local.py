"""The `local` runtime: the execution server as a plain host process. No isolation at all.

For development on a laptop only; start_sandbox logs a warning every time it is used.
"""

from __future__ import annotations

import logging
import sys

from orchestrator.config import Runtime
from orchestrator.sandbox.runtime import SandboxRuntime
from orchestrator.sandbox.spec import SERVER_PACKAGE, LaunchSpec, server_command

log = logging.getLogger(__name__)


def build_argv(spec: LaunchSpec) -> list[str]:
    return server_command(sys.executable, str(SERVER_PACKAGE.parent))


class LocalRuntime(SandboxRuntime):
    """A plain host process: the workspace is the host directory itself, no cgroup, a warning."""

    name = Runtime.LOCAL
    inside_workspace = None
    confinable = False

    def argv(self, spec: LaunchSpec) -> list[str]:
        return build_argv(spec)

    def announce(self, job_id: str) -> None:
        log.warning(
            "sandbox runtime 'local' for job %s: commands run on the host WITHOUT isolation "
            "(development only; use bwrap or apptainer for real runs)", job_id,
        )

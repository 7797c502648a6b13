"""The `local` runtime: the execution server as a plain host process. No isolation at all.

For development on a laptop only; start_sandbox logs a warning every time it is used.
"""

from __future__ import annotations

import sys

from orchestrator.sandbox.spec import SERVER_PACKAGE, LaunchSpec, server_command


def build_argv(spec: LaunchSpec) -> list[str]:
    return server_command(sys.executable, str(SERVER_PACKAGE.parent))

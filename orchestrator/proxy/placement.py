"""Where a job's proxy directory lives: in its sandbox's own control directory.

Every sandbox has a private host directory bound inside it, the one holding its execution
server's socket (at INSIDE_RUN; the `local` runtime sees the host path itself). The job's proxy
directory is made there when RUN starts, so it lives exactly as long as the sandbox: closing the
sandbox (after RUN, or when the job is cancelled, fails or times out) removes it, the sweep of a
dead worker's sandboxes removes it, and a job cancelled between INIT and RUN never had one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.proxy.server import new_proxy_dir
from orchestrator.sandbox.spec import INSIDE_RUN

PROXY_DIR_NAME = "llm"


def proxy_dir_in(sandbox: Any) -> tuple[Path, str]:
    """A new proxy directory in `sandbox`'s control directory: (host path, path inside the sandbox)."""
    record = getattr(sandbox, "record", None)
    if record is None or not getattr(record, "socket", None):
        raise ValueError(f"a {sandbox.kind} sandbox has no control directory on this host; the harness "
                         "handler needs a process sandbox (bwrap, apptainer, local)")
    directory = new_proxy_dir(Path(record.socket).parent, PROXY_DIR_NAME)
    inside = str(directory) if sandbox.kind == "local" else f"{INSIDE_RUN}/{PROXY_DIR_NAME}"
    return directory, inside

"""One class per sandbox runtime: what bwrap, Apptainer and local do differently at launch.

launch.py does everything they share (runtime directory, workspace, loopback address, cgroup,
the process, the READY handshake, the record); a runtime states only its differences as class
attributes and two methods, the way submitit's executors or dask-jobqueue's Job subclasses do.
The registry of these classes by name is RUNTIME_CLASSES in api.py, keyed by the one list of
runtime names (orchestrator/config.py (Runtime)).
"""

from __future__ import annotations

import abc
import logging
from typing import ClassVar

from orchestrator.config import Runtime
from orchestrator.sandbox.options import WORKSPACE, SandboxOptions
from orchestrator.sandbox.spec import LaunchSpec

log = logging.getLogger(__name__)


class SandboxRuntime(abc.ABC):
    """How one runtime starts the execution server; defaults are the isolating runtimes' ways."""

    name: ClassVar[Runtime]
    # Where the job sees its workspace: a mount point inside, or None for the host path itself.
    inside_workspace: ClassVar[str | None] = WORKSPACE
    # The runtime mounts /workspace itself (a tmpfs of limits.workspace_mb, see workspace.py)
    # instead of binding a fresh host directory.
    mounts_tmpfs_workspace: ClassVar[bool] = False
    # The runtime writes the sandboxed child's pid on an extra pipe (bwrap --json-status-fd).
    reports_child_pid: ClassVar[bool] = False
    # The runtime reads its own settings from the host environment (and cleans it itself);
    # otherwise the process gets a minimal PATH + LANG.
    needs_host_env: ClassVar[bool] = False
    # Whether the sandbox may be put into its own cgroup (a process on the host is not sandboxed).
    confinable: ClassVar[bool] = True

    def __init__(self, options: SandboxOptions) -> None:
        self.options = options

    @abc.abstractmethod
    def argv(self, spec: LaunchSpec) -> list[str]:
        """The command line that starts the execution server in this runtime."""

    def prepare(self, spec: LaunchSpec) -> None:
        """Write what the command line refers to into spec.runtime_dir (nothing by default)."""

    def announce(self, job_id: str) -> None:
        """Say something before starting, once per sandbox (nothing by default)."""

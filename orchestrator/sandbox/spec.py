"""What a runtime needs to build its command line for one sandbox."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ptyprocess

from orchestrator.sandbox.options import CONTROL_DIR, WORKSPACE, SandboxOptions

SERVER_PACKAGE = Path(__file__).resolve().parent / "server"
PTYPROCESS_PACKAGE = Path(ptyprocess.__file__).resolve().parent
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Inside the sandbox: the server's code, and the directory holding its socket.
INSIDE_PY = f"{CONTROL_DIR}/py"
INSIDE_RUN = f"{CONTROL_DIR}/run"


@dataclass(frozen=True)
class LaunchSpec:
    sandbox_id: str
    job_id: str
    runtime_dir: Path          # host, private to the owner (record, log)
    socket_dir: Path           # host; bound into the sandbox at INSIDE_RUN
    workspace: Path | None     # host directory bound at /workspace; None: the runtime mounts a tmpfs
    options: SandboxOptions
    loopback: str
    status_fd: int | None = None

    def sandbox_env(self, workspace: str = WORKSPACE) -> dict[str, str]:
        """The clean environment of commands in the sandbox (nothing from the host)."""
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": workspace,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "HPC_ROLLOUT_SANDBOX": self.sandbox_id,
            "HPC_ROLLOUT_JOB_ID": self.job_id,
            "HPC_ROLLOUT_LOOPBACK": self.loopback,
        }
        env.update(dict(self.options.env))
        return env


def server_command(python: str, root: str) -> list[str]:
    """argv that starts the execution server from the package mounted at `root`."""
    boot = (
        f"import sys; sys.path[:0] = [{root!r}]; "
        "from server.exec_server import main; main()"
    )
    return [python, "-E", "-s", "-B", "-c", boot]

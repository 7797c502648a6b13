"""Apptainer / Singularity command line (the production runtime on HPC clusters).

`exec` with --containall (own fs, PID, IPC; clean env), --no-home, --cleanenv (no SLURM_*
or PMIX_* inside), --net --network none when the network is off (--network alone is
silently ignored), --writable-tmpfs, optional --fakeroot, binds and --pwd. Environment
variables go through --env-file because --cleanenv drops everything else (and --env would
split a value at its commas, e.g. CUDA_VISIBLE_DEVICES=0,1).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from orchestrator.config import Runtime
from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.options import WORKSPACE, SandboxOptions
from orchestrator.sandbox.runtime import SandboxRuntime
from orchestrator.sandbox.spec import (
    INSIDE_PY, INSIDE_RUN, PTYPROCESS_PACKAGE, SERVER_PACKAGE, LaunchSpec, server_command,
)

BINARIES = ("apptainer", "singularity")


def find_apptainer() -> str | None:
    """The apptainer (preferred) or singularity executable on PATH, or None."""
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    return None


def require_apptainer() -> str:
    path = find_apptainer()
    if path is None:
        raise SandboxConfigError(
            "neither apptainer nor singularity is on PATH: `module load apptainer` on the "
            "cluster, or use --runtime bwrap (bubblewrap) on machines without it"
        )
    return path


def build_argv(spec: LaunchSpec, binary: str = "apptainer") -> list[str]:
    opts = spec.options
    if opts.image is None:
        raise SandboxConfigError(
            "the apptainer runtime needs an image (a .sif file or sandbox directory): pass "
            "image=... / --image, build one with `hpc-rollout image build`"
        )
    argv = [binary, "exec", "--containall", "--no-home", "--cleanenv"]
    if not opts.network:
        argv += ["--net", "--network", "none"]
    argv.append("--writable-tmpfs")
    if opts.fakeroot:
        argv.append("--fakeroot")
    argv += [
        "--pwd", WORKSPACE,
        "--bind", f"{spec.workspace}:{WORKSPACE}:rw",
        "--bind", f"{spec.socket_dir}:{INSIDE_RUN}:rw",
        "--bind", f"{SERVER_PACKAGE}:{INSIDE_PY}/server:ro",
        "--bind", f"{PTYPROCESS_PACKAGE}:{INSIDE_PY}/ptyprocess:ro",
    ]
    for bind in opts.binds:
        argv += ["--bind", f"{bind.source}:{bind.target}:{'ro' if bind.read_only else 'rw'}"]
    argv += ["--env-file", str(env_file(spec))]
    argv.append(str(opts.image))
    argv += server_command("python3", INSIDE_PY)
    return argv


def env_file(spec: LaunchSpec) -> Path:
    return spec.runtime_dir / "apptainer.env"


def write_env_file(spec: LaunchSpec) -> None:
    """The sandbox environment as single-quoted shell assignments (the format apptainer reads)."""
    lines = []
    for name, value in sorted(spec.sandbox_env().items()):
        if name != "PATH":  # the image's own PATH stays
            lines.append(f"{name}='" + value.replace("'", "'\\''") + "'")
    env_file(spec).write_text("\n".join(lines) + "\n")


class ApptainerRuntime(SandboxRuntime):
    """Apptainer or Singularity: reads its settings (APPTAINER_*, XDG_RUNTIME_DIR) from the host
    environment, which --cleanenv then strips; the sandbox's own environment goes in an env file."""

    name = Runtime.APPTAINER
    needs_host_env = True

    def __init__(self, options: SandboxOptions) -> None:
        super().__init__(options)
        self.binary = require_apptainer()

    def argv(self, spec: LaunchSpec) -> list[str]:
        return build_argv(spec, binary=self.binary)

    def prepare(self, spec: LaunchSpec) -> None:
        write_env_file(spec)

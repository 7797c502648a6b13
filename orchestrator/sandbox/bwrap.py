"""bubblewrap command line: every namespace unshared, read-only image, writable workspace.

The image is either a directory (a rootfs made by `hpc-rollout image build --format dir`)
or, when none is given, the host's /usr read-only plus a small whitelist of /etc. Each
top-level entry of an image directory is bound separately onto bwrap's tmpfs root, so the
image needs no pre-made mount points for /workspace or the runtime's own directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from orchestrator.config import Runtime
from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.options import CONTROL_DIR, WORKSPACE, SandboxOptions
from orchestrator.sandbox.runtime import SandboxRuntime
from orchestrator.sandbox.spec import (
    DEFAULT_PATH, INSIDE_PY, INSIDE_RUN, PTYPROCESS_PACKAGE, SERVER_PACKAGE, LaunchSpec,
    server_command,
)

# Top-level image entries the sandbox gets fresh instead of from the image.
SKIPPED_TOP_LEVEL = {"proc", "dev", "sys", "tmp", "run", "workspace", CONTROL_DIR.lstrip("/")}
# Host /etc entries needed by ordinary tools and harmless to show (no shadow, no secrets).
HOST_ETC = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates",
    "ca-certificates.conf", "localtime", "nsswitch.conf", "mime.types", "protocols", "services",
    "bash.bashrc", "inputrc", "python3", "python3.11",
)


def find_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxConfigError(
            "bubblewrap (bwrap) is not on PATH: install it (Debian/Ubuntu: apt-get install "
            "bubblewrap) or choose --runtime apptainer / local"
        )
    return path


def image_args(image: Path | None) -> list[str]:
    if image is None:
        args = ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink(f"/{name}"):
                args += ["--symlink", f"usr/{name}", f"/{name}"]
            elif os.path.isdir(f"/{name}"):
                args += ["--ro-bind", f"/{name}", f"/{name}"]
        for name in HOST_ETC:
            if os.path.exists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        return args
    if not image.is_dir():
        raise SandboxConfigError(
            f"bubblewrap needs a directory image, {image} is a file; build one with "
            "`hpc-rollout image build TEMPLATE --format dir` (SIF files need --runtime apptainer)"
        )
    args = []
    for entry in sorted(os.listdir(image)):
        if entry in SKIPPED_TOP_LEVEL:
            continue
        path = image / entry
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{entry}"]
        else:
            args += ["--ro-bind", str(path), f"/{entry}"]
    return args


def build_argv(spec: LaunchSpec, bwrap: str = "bwrap") -> list[str]:
    opts = spec.options
    argv = [
        bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--new-session", "--hostname", "sandbox",
    ]
    if opts.network:
        argv.append("--share-net")
    if opts.fakeroot:
        argv += ["--uid", "0", "--gid", "0"]
    argv += image_args(opts.image)
    argv += [
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(opts.limits.tmp_mb << 20), "--tmpfs", "/tmp",
        *(["--bind", str(spec.workspace), WORKSPACE] if spec.workspace is not None
          else ["--size", str(opts.limits.workspace_mb << 20), "--tmpfs", WORKSPACE]),
        "--ro-bind", str(SERVER_PACKAGE), f"{INSIDE_PY}/server",
        "--ro-bind", str(PTYPROCESS_PACKAGE), f"{INSIDE_PY}/ptyprocess",
        "--bind", str(spec.socket_dir), INSIDE_RUN,
    ]
    for extra in ("passwd", "group", "hosts"):
        path = spec.runtime_dir / extra
        if path.exists():
            argv += ["--ro-bind", str(path), f"/etc/{extra}"]
    for bind in opts.binds:
        argv += ["--ro-bind" if bind.read_only else "--bind", str(bind.source), bind.target]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv", "--setenv", "PATH", DEFAULT_PATH]
    if spec.status_fd is not None:
        argv += ["--json-status-fd", str(spec.status_fd)]
    argv += server_command("python3", INSIDE_PY)
    return argv


def write_identity_files(spec: LaunchSpec, uid: int, gid: int) -> None:
    """Minimal passwd/group/hosts so tools can name the user and the sandbox's address."""
    user = "root" if uid == 0 else "agent"
    (spec.runtime_dir / "passwd").write_text(
        f"{user}:x:{uid}:{gid}:sandbox user:{WORKSPACE}:/bin/bash\n"
        + ("" if uid == 0 else "root:x:0:0:root:/root:/bin/bash\n")
        + "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (spec.runtime_dir / "group").write_text(
        f"{user}:x:{gid}:\n" + ("" if gid == 0 else "root:x:0:\n") + "nogroup:x:65534:\n"
    )
    (spec.runtime_dir / "hosts").write_text(
        f"127.0.0.1 localhost\n::1 localhost\n{spec.loopback} sandbox\n"
    )


class BwrapRuntime(SandboxRuntime):
    """bubblewrap: mounts its own tmpfs /workspace, reports the child's pid on --json-status-fd,
    and (without an image) gets passwd/group/hosts files naming the sandbox user."""

    name = Runtime.BWRAP
    mounts_tmpfs_workspace = True
    reports_child_pid = True

    def __init__(self, options: SandboxOptions) -> None:
        super().__init__(options)
        self.binary = find_bwrap()

    def argv(self, spec: LaunchSpec) -> list[str]:
        return build_argv(spec, bwrap=self.binary)

    def prepare(self, spec: LaunchSpec) -> None:
        if self.options.image is None:
            uid, gid = (0, 0) if self.options.fakeroot else (os.getuid(), os.getgid())
            write_identity_files(spec, uid, gid)

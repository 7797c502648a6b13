"""Directory images for bubblewrap: a Debian rootfs, then the template's %post inside it.

mmdebstrap (or debootstrap) creates the rootfs with the template's packages included (or,
for `Bootstrap: localimage`, the rootfs starts as a copy of the directory image it names); the
rendered %setup runs on the host with $APPTAINER_ROOTFS set and %post in a bubblewrap chroot with
the network shared, exactly as `apptainer build` would run them. Layered builds (from a lock or versioned image) copy the
base directory and run only the layer's %post.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.images.cache import BuildAction, BuildPlan
from orchestrator.sandbox.images.templates import Rendered, sections


class DirBuildError(SandboxConfigError):
    pass


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise DirBuildError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-3000:]}")


def copy_base_image(rendered: Rendered, output: Path) -> None:
    """`Bootstrap: localimage` for directory images: the layer starts as a copy of its base."""
    base = Path(str(rendered.variables.get("from_image") or ""))
    if not str(base) or not (base / "usr").is_dir():
        raise SandboxConfigError(
            f"bootstrap=localimage needs --set from_image=DIR, a directory image (a rootfs with usr/), "
            f"e.g. one built by `hpc-rollout image build tasks --format dir`; got {str(base)!r}"
        )
    _run(["cp", "-a", "--reflink=auto", str(base), str(output)], "copying the base image")


def bootstrap_rootfs(rendered: Rendered, output: Path) -> None:
    variables = rendered.variables
    if variables.get("bootstrap") == "localimage":
        copy_base_image(rendered, output)
        return
    if variables.get("bootstrap") != "debootstrap":
        raise SandboxConfigError(
            "--format dir builds a Debian rootfs (--set bootstrap=debootstrap) or layers on a "
            f"directory image (--set bootstrap=localimage --set from_image=DIR); the template says "
            f"bootstrap={variables.get('bootstrap')}"
        )
    packages = ",".join(["python3", "ca-certificates", *variables.get("apt_packages", [])])
    suite, mirror = str(variables["os_version"]), str(variables["mirror"])
    if shutil.which("mmdebstrap"):
        mode = "root" if os.getuid() == 0 else "unshare"
        command = ["mmdebstrap", f"--mode={mode}", "--variant=minbase", f"--include={packages}",
                   "--aptopt=Acquire::Retries=3",
                   '--aptopt=APT::Install-Recommends "false"', suite, str(output), mirror]
    elif shutil.which("debootstrap") and os.getuid() == 0:
        command = ["debootstrap", "--variant=minbase", f"--include={packages}", suite, str(output), mirror]
    else:
        raise SandboxConfigError(
            "--format dir needs mmdebstrap (any user) or debootstrap (root): apt-get install mmdebstrap"
        )
    _run(command, "bootstrapping the rootfs")


def run_setup(root: Path, script: str) -> None:
    """The template's %setup, as Apptainer runs it: on the build host, as the building user, with
    the image's root in $APPTAINER_ROOTFS (and $SINGULARITY_ROOTFS)."""
    if not script.strip():
        return
    env = {**os.environ, "APPTAINER_ROOTFS": str(root), "SINGULARITY_ROOTFS": str(root)}
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise DirBuildError(f"%setup failed ({done.returncode}): {(done.stderr or done.stdout)[-3000:]}")


def run_post(root: Path, script: str) -> None:
    """The template's %post, run inside the rootfs with the host's network and DNS."""
    if not script.strip():
        return
    command = ["bwrap", "--bind", str(root), "/", "--proc", "/proc", "--dev", "/dev",
               "--perms", "1777", "--tmpfs", "/tmp", "--share-net", "--die-with-parent",
               "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    if os.getuid() != 0:  # root builds like `apptainer build` as root; others fake it
        command += ["--unshare-user", "--uid", "0", "--gid", "0"]
    command += ["--clearenv", "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--setenv", "HOME", "/root", "/bin/sh", "-c", script]
    _run(command, "%post")


# Caches and documentation nobody reads inside a sandbox: about half of a minimal rootfs.
CLEANED = ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
           "usr/share/info", "usr/share/locale", "var/log")


def clean_rootfs(root: Path) -> None:
    for relative in CLEANED:
        directory = root / relative
        if directory.is_dir() and not directory.is_symlink():
            shutil.rmtree(directory)
            directory.mkdir()
    for needed in ("var/cache/apt/archives/partial", "var/lib/apt/lists/partial"):
        (root / needed).mkdir(parents=True, exist_ok=True)  # apt in a layered build


def build_dir_image(rendered: Rendered, definition: Path, output: Path, plan: BuildPlan) -> None:
    if plan.action in (BuildAction.FROM_LOCK, BuildAction.FROM_VERSIONED):
        assert plan.base is not None
        _run(["cp", "-a", "--reflink=auto", str(plan.base), str(output)], "copying the base image")
    else:
        bootstrap_rootfs(rendered, output)
    parts = sections(rendered.text)
    for line in parts.get("files", "").splitlines():
        fields = line.split()
        if len(fields) == 2:
            target = output / fields[1].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            _run(["cp", "-a", fields[0], str(target)], f"%files {line.strip()}")
    run_setup(output, parts.get("setup", ""))
    # resolv.conf must exist as a mount point for the %post chroot.
    (output / "etc" / "resolv.conf").touch()
    run_post(output, parts.get("post", ""))
    clean_rootfs(output)
    for mount_point in ("workspace", ".hpc-rollout", "tmp", "proc", "dev"):
        (output / mount_point).mkdir(exist_ok=True)

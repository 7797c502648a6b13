"""Fixtures of the NFS-like rig: a base directory and the path every node sees it at."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fsrig.nfsview import ClientTimes
from tests.fsrig.rig import REPO, Rig

# Mounting a view needs FUSE (root, /dev/fuse) and a mount namespace per node; CI runs as root.
needs_rig = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse") or shutil.which("unshare") is None,
                               reason="the NFS-like rig mounts FUSE views in mount namespaces: root and /dev/fuse")


@pytest.fixture
def rig_dirs(tmp_path: Path) -> tuple[Path, Path]:
    base, at = tmp_path / "server", tmp_path / "view"
    base.mkdir()
    at.mkdir()
    return base, at


def run_node(rig: Rig, code: str, *args: str, timeout: float = 120) -> str:
    """`code` (a Python script) run as a node of `rig`; its standard output."""
    done = subprocess.run(rig.node([sys.executable, "-c", textwrap.dedent(code), *args]), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"node failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def quick(**times: object) -> ClientTimes:
    """Client times scaled down so that a test waits seconds, not the defaults' minute."""
    return ClientTimes(**{"acregmin": 1.0, "acdirmin": 3.0, **times})   # type: ignore[arg-type]

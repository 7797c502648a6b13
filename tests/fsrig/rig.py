"""The rig's settings and how a program runs as a node of it.

Each node sees the one real directory (`base`, the server's export) through a view of its own
with an NFS client's caches (tests/fsrig/nfsview.py), mounted at the same path (`at`) in the
node's own mount namespace (tests/fsrig/node.py). NFS_DEFAULTS are a Linux client's defaults
(acregmin 3 s, acdirmin 30 s, lookupcache=all, close-to-open); NOCTO is the same without
close-to-open revalidation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fsrig.nfsview import ClientTimes

REPO = Path(__file__).resolve().parents[2]
NFS_DEFAULTS = ClientTimes()
NOCTO = ClientTimes(cto=False)


@dataclass(frozen=True)
class Rig:
    """`base` is the one real directory (the server's export); every node sees it at `at`."""

    base: Path
    at: Path
    client: ClientTimes = NFS_DEFAULTS

    def node(self, command: list[str]) -> list[str]:
        """`command` run as a node of its own: a private mount namespace, its own view at `at`."""
        return ["unshare", "-m", "--propagation", "private", sys.executable, "-m", "tests.fsrig.node",
                str(self.base), str(self.at), self.client.options(), "--", *command]

    def seen_from_node(self, path: Path) -> Path:
        """Where a node sees a path of the base (the run directory, say)."""
        return self.at / path.relative_to(self.base)

    def popen(self, command: list[str], **options: Any) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        return subprocess.Popen(self.node(command), cwd=REPO, env={**env, **options.pop("env", {})}, **options)


def start_worker(rig: Rig, run: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A real worker as a node of `rig`, for the run directory `run` of the base: in a session of
    its own (the test signals it and its group), its log in the run (worker-N.log, as
    tests/core/util.start_worker writes it)."""
    log = open(run / f"worker-{time.monotonic_ns()}.log", "wb")
    return rig.popen([sys.executable, "-m", "orchestrator.worker", str(rig.seen_from_node(run)), "-v", *args],
                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env or {})


def sees_through_view(pid: int, at: Path) -> bool:
    """Whether process `pid` sees `at` as an NFS-like view (its mount namespace's mount table)."""
    try:
        mounts = Path(f"/proc/{pid}/mounts").read_text()
    except OSError:
        return False
    return any(line.split()[:3] == ["nfsview", str(at), "fuse"] for line in mounts.splitlines())

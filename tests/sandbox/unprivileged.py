"""Run a command as an unprivileged user (nobody), from a root test process.

Cluster users are never root, so the sandbox must work for them: the test runs this
project's own interpreter and code as `nobody`. Those often live under a directory others
cannot enter (pyenv under /root, a clone in root's home); rather than loosen permissions on
the host, the command runs in a private mount namespace where each such directory is
replaced by a world-traversable stand-in that shows only the paths the command needs.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

NOBODY = 65534


def closed_ancestor(path: Path) -> Path | None:
    """The top-most directory on the way to `path` that others cannot enter, if any."""
    for parent in reversed(path.resolve().parents):
        if parent != Path("/") and not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


def mount_script(needed: list[Path], scratch: Path) -> list[str]:
    """Shell lines that, in a private mount namespace, make every `needed` path reachable."""
    lines: list[str] = []
    by_closed: dict[Path, list[Path]] = {}
    for path in needed:
        closed = closed_ancestor(path)
        if closed is not None:
            by_closed.setdefault(closed, []).append(path.resolve())
    for index, (closed, paths) in enumerate(sorted(by_closed.items())):
        view = scratch / f"view{index}"
        for path in paths:
            mirror = view / path.relative_to(closed)
            mirror.mkdir(parents=True, exist_ok=True)
            lines.append(f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(mirror))}")
        for directory in [view, *view.rglob("*")]:
            directory.chmod(0o755)
        # --rbind: the stand-in carries the binds made inside it.
        lines.append(f"mount --rbind {shlex.quote(str(view))} {shlex.quote(str(closed))}")
    return lines


def run_as_nobody(argv: list[str], needed: list[Path], scratch: Path, env: dict[str, str],
                  timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`argv` as uid/gid 65534 with no supplementary groups and no capabilities."""
    scratch.mkdir(parents=True, exist_ok=True)
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--"]
    script = "\n".join(["set -e", *mount_script(needed, scratch), 'exec "$@"'])
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *drop, *argv],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


def project_paths() -> list[Path]:
    """What a Python process running this project needs to see: interpreter, packages, code."""
    import orchestrator

    repo = Path(orchestrator.__file__).resolve().parent.parent
    return [Path(sys.base_prefix), Path(sys.prefix), repo]

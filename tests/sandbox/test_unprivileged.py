"""bubblewrap sandboxes started by an unprivileged user, as on a cluster (CI runs as root)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.sandbox.helpers import needs_bwrap, sandbox_processes
from tests.sandbox.unprivileged import NOBODY, project_paths, run_as_nobody

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: every other sandbox test covers this"),
]

# Inside the sandbox: who we are, what we can write, see and reach.
PROBE = r"""
import os, socket
print("uid", os.getuid())
open("/workspace/made-inside", "w").write("ok")
for target in ("/usr/escape", "/etc/escape", "/escape"):
    try:
        open(target, "w")
        print("wrote", target)
    except OSError as exc:
        print("refused", target, exc.errno)
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("1.1.1.1", 53)); print("net connected")
except OSError as exc:
    print("net", exc.errno)
print("env", sorted(k for k in os.environ if k.startswith(("SLURM", "SECRET"))))
"""


def test_an_unprivileged_user_gets_a_contained_sandbox(private_runtime: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="hr-nobody-", dir="/tmp"))
    workspace = home / "ws"
    workspace.mkdir()
    for directory in (home, workspace):
        os.chown(directory, NOBODY, NOBODY)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": str(project_paths()[-1]),
        # node-local dirs of the sandboxes, under the test's runtime dir so leftovers are found
        "HPC_ROLLOUT_RUNTIME_DIR": str(private_runtime / "nobody-rt"),
        "HPC_ROLLOUT_LOOPBACK_DIR": str(private_runtime / "nobody-lo"),
        "SLURM_JOB_ID": "4242", "SECRET_TOKEN": "hunter2",
    }
    os.chown(private_runtime, NOBODY, NOBODY)
    try:
        result = run_as_nobody(
            [sys.executable, "-c", "from orchestrator.cli import main; main()", "sandbox", "exec",
             "--runtime", "bwrap", "--workspace", str(workspace), "--", "python3", "-c", PROBE],
            needed=project_paths(), scratch=home / "mounts", env=env,
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert f"uid {NOBODY}" in lines, result.stdout
        assert (workspace / "made-inside").read_text() == "ok"
        assert sum(line.startswith("refused /") for line in lines) == 3, result.stdout
        assert not any(line.startswith("wrote") for line in lines)
        pids = next(line for line in lines if line.startswith("pids"))
        assert len(eval(pids[5:])) <= 4, f"host processes visible: {pids}"
        assert "net 101" in lines, result.stdout      # ENETUNREACH: no interface but loopback
        assert "env []" in lines, result.stdout
        assert not sandbox_processes(private_runtime)
    finally:
        os.chown(private_runtime, 0, 0)
        shutil.rmtree(home, ignore_errors=True)

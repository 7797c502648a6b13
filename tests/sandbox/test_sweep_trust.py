"""The sweep acts only on directories and records this user created: 0700, owned by the user.

Another local user who creates /tmp/hpc-rollout-<uid>/ first, or plants a record in it, must not
be able to make our sweep kill our processes, delete our files or kill a cgroup's processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.procs import ProcessId
from orchestrator.sandbox.records import runtime_base, sandboxes_dir
from orchestrator.sandbox.sweep import sweep_orphaned_sandboxes

OTHER_UID = 65534  # nobody

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="planting files as another user needs root (CI runs as root)")


def victim(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """One of our processes and one of our directories, which a planted record will name."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    data = tmp_path / "precious"
    data.mkdir()
    (data / "results.txt").write_text("a week of work\n")
    return process, data


def plant_record(sandbox_dir: Path, process: subprocess.Popen[bytes], target: Path, owner: int) -> None:
    """A record that says: owner gone, kill this process, delete this directory."""
    sandbox_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "id": sandbox_dir.name, "kind": "bwrap", "job_id": "x", "node": "n", "runtime_dir": str(target),
        "socket": str(target / "s" / "sock"), "secret": "s", "owner": [999999, 1],
        "process": ProcessId.of(process.pid).to_json(), "child": None, "loopback": None, "cgroup": None,
        "deadline": time.time() + 3600, "workspace": str(target),
    }
    (sandbox_dir / "record.json").write_text(json.dumps(record))
    for path in (sandbox_dir / "record.json", sandbox_dir, *sandbox_dir.parents):
        if path == Path(os.environ["HPC_ROLLOUT_RUNTIME_DIR"]).parent:
            break
        os.chown(path, owner, owner)


def assert_untouched(process: subprocess.Popen[bytes], data: Path) -> None:
    try:
        assert process.poll() is None, "the sweep killed a process named by a record it did not create"
        assert (data / "results.txt").read_text() == "a week of work\n", "the sweep deleted our files"
    finally:
        process.kill()
        process.wait()


@needs_root
def test_a_runtime_directory_created_by_another_user_is_refused(private_runtime: Path, tmp_path: Path) -> None:
    process, data = victim(tmp_path)
    base = Path(os.environ["HPC_ROLLOUT_RUNTIME_DIR"])
    plant_record(base / "sb" / "abcdef012345", process, data, OTHER_UID)
    with pytest.raises(SandboxConfigError, match="owned by uid 65534"):
        runtime_base()
    with pytest.raises(SandboxConfigError):
        sweep_orphaned_sandboxes()
    assert_untouched(process, data)


def test_a_runtime_directory_others_may_write_is_refused(private_runtime: Path, tmp_path: Path) -> None:
    process, data = victim(tmp_path)
    sb = sandboxes_dir()
    os.chmod(sb, 0o777)  # as another user's `mkdir -m 777` first would leave it
    plant_record(sb / "abcdef012345", process, data, os.getuid())
    with pytest.raises(SandboxConfigError, match="mode is 0o777"):
        sweep_orphaned_sandboxes()
    assert_untouched(process, data)


@needs_root
def test_a_record_planted_by_another_user_is_ignored(private_runtime: Path, tmp_path: Path) -> None:
    process, data = victim(tmp_path)
    planted = sandboxes_dir() / "abcdef012345"
    planted.mkdir(mode=0o700)
    plant_record(planted, process, data, os.getuid())
    os.chown(planted / "record.json", OTHER_UID, OTHER_UID)
    assert sweep_orphaned_sandboxes() == 0
    assert_untouched(process, data)


def test_a_record_naming_a_directory_outside_its_own_is_ignored(private_runtime: Path, tmp_path: Path) -> None:
    process, data = victim(tmp_path)
    planted = sandboxes_dir() / "abcdef012345"
    planted.mkdir(mode=0o700)
    plant_record(planted, process, data, os.getuid())
    os.chmod(planted / "record.json", 0o600)
    assert sweep_orphaned_sandboxes() == 0
    assert_untouched(process, data)

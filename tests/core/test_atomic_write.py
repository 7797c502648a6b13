"""One atomic-write primitive (fsops.write_atomic), counted, used by every writer of small files."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from orchestrator.spool import fsops
from orchestrator.llm.files import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]

# Renames that are not "replace a small file": directory publishes, quarantine moves, the
# in-sandbox server (a separate program that must not import the orchestrator), and the doctor's
# probes (they race renames to measure the filesystem itself).
OTHER_RENAMES = {
    "orchestrator/spool/fsops.py",
    "orchestrator/sandbox/server/exec_server.py",
    "orchestrator/sandbox/server/tools/files.py",
    "orchestrator/sandbox/images/builder.py",
    "orchestrator/devserver/tiny_model.py",
    "orchestrator/llm/registry.py",
    "orchestrator/doctor/probes.py",
}


def _delta(before: fsops.Counter[str]) -> dict[str, int]:
    return {k: v for k, v in (fsops.OPS - before).items() if v}


def test_write_atomic_replaces_whole_files_and_counts_every_operation(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    before = fsops.Counter(fsops.OPS)
    fsops.write_atomic(target, b"new", durability=fsops.Durability.FULL, mode=0o600)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["state.json"], "a temporary was left behind"
    assert _delta(before) == {"create": 1, "rename": 1, "fsync": 1, "fsync_dir": 1}


def test_the_llm_layer_and_the_launch_link_go_through_the_counted_primitive(tmp_path: Path) -> None:
    before = fsops.Counter(fsops.OPS)
    write_json_atomic(tmp_path / "backends.json", {"a": 1})
    fsops.point_symlink(tmp_path / "latest", "launch-1")
    fsops.point_symlink(tmp_path / "latest", "launch-2")
    assert os.readlink(tmp_path / "latest") == "launch-2"
    assert _delta(before) == {"create": 3, "rename": 3}
    assert sorted(os.listdir(tmp_path)) == ["backends.json", "latest"]


def test_no_other_module_replaces_files_by_hand() -> None:
    offenders = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if name not in OTHER_RENAMES and re.search(r"\bos\.(replace|rename)\(", path.read_text()):
            offenders.append(name)
    assert not offenders, f"use fsops.write_atomic / fsops.point_symlink in {offenders}"


def test_the_first_json_write_into_a_new_directory_creates_it(tmp_path: Path) -> None:
    target = tmp_path / "inflight" / "w1.json"
    write_json_atomic(target, {"n": 1}, durable=True)
    assert target.read_bytes() == b'{"n":1}\n'
    assert os.listdir(target.parent) == ["w1.json"]

"""Per-sandbox totals (memory, workspace size) and workspaces that start clean and go away."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.config import RunConfig
from orchestrator.spool.paths import SpoolPaths
from orchestrator.sandbox import cgroups
from orchestrator.sandbox.start import start_sandbox
from orchestrator.sandbox.limits import Limits
from orchestrator.submission.submit import submit_file
from tests.core.util import drain_with_a_worker, make_run, rows, start_worker, stop_worker, wait_drained, write_jsonl
from tests.sandbox.helpers import needs_bwrap, run, sandbox_processes

pytestmark = needs_bwrap
MiB = 1 << 20


async def bash_in_fresh_sandbox(spool: SpoolPaths, runtime: str, command: str, **options: object) -> str:
    sandbox = await start_sandbox(runtime, job_id="t-0000001-0000", paths=spool, **options)
    try:
        return (await sandbox.bash(command, timeout=60)).output
    finally:
        await sandbox.close()


@pytest.mark.parametrize("runtime", ["bwrap", "local"])
def test_a_retry_gets_a_fresh_workspace(spool: SpoolPaths, runtime: str) -> None:
    first = run(bash_in_fresh_sandbox(spool, runtime, "echo the-answer-is-42 > hint.txt && ls -A"))
    assert "hint.txt" in first
    second = run(bash_in_fresh_sandbox(spool, runtime, "ls -A; cat hint.txt 2>&1"))
    assert "the-answer-is-42" not in second and "No such file" in second


def test_the_workspace_has_a_size_cap_and_lives_off_the_spool(spool: SpoolPaths, private_runtime: Path) -> None:
    output = run(bash_in_fresh_sandbox(
        spool, "bwrap", "dd if=/dev/zero of=/workspace/big bs=1M count=40 2>&1; du -sm /workspace | cut -f1",
        limits={"workspace_mb": 8}))
    assert "No space left on device" in output
    assert int(output.split()[-1]) <= 8
    spool_bytes = sum(p.stat().st_size for p in spool.root.rglob("*") if p.is_file()) if spool.root.exists() else 0
    assert spool_bytes < 8 * MiB, "the workspace must not be written to the shared filesystem"
    assert sandbox_processes(private_runtime) == []


def test_a_kept_workspace_is_copied_out_within_the_cap(spool: SpoolPaths) -> None:
    run(bash_in_fresh_sandbox(spool, "bwrap", "mkdir -p d && echo kept > d/f.txt && ln -s /etc/passwd d/link && mkfifo d/pipe",
                              keep_workspace=True))
    kept = list(spool.job_dir("t-0000001-0000").glob("workspace-kept.*"))
    assert len(kept) == 1
    assert (kept[0] / "d" / "f.txt").read_text() == "kept\n"
    assert (kept[0] / "d" / "link").is_symlink() and os.readlink(kept[0] / "d" / "link") == "/etc/passwd"
    assert not (kept[0] / "d" / "pipe").exists()


needs_memory_cgroup = pytest.mark.skipif(
    not cgroups.memory_available(), reason="no writable memory cgroup here (root on a cgroup host: CI); "
    "the documented fallback (RLIMIT_AS) is tested below")


@needs_memory_cgroup
def test_memory_is_capped_for_the_sandbox_as_a_whole(spool: SpoolPaths) -> None:
    # Three processes of 48 MiB each: each is far below the per-process limit, together they are not.
    hog = "python3 -c 'import time; b = bytearray(48 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(3)'"
    output = run(bash_in_fresh_sandbox(
        spool, "bwrap", f"for i in 1 2 3; do ( {hog}; echo exit=$? ) & done; wait",
        limits={"total_memory_mb": 96, "memory_mb": 4096}))
    codes = [line for line in output.splitlines() if line.startswith("exit=")]
    assert len(codes) == 3 and "exit=137" in codes, output  # the kernel's OOM killer ended one


def test_without_a_memory_cgroup_each_process_is_held_to_the_total() -> None:
    limits = Limits.parse({"total_memory_mb": 512, "memory_mb": 4096})
    assert limits.rlimits(memory_cgroup=False)["RLIMIT_AS"] == 512 * MiB
    assert limits.rlimits(memory_cgroup=True)["RLIMIT_AS"] == 4096 * MiB


def test_run_toml_sets_the_totals_and_they_reach_every_sandbox(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"sandbox.runtime": "bwrap", "sandbox.workspace_mb": 4,
                                          "sandbox.total_memory_mb": 256})
    config = RunConfig.load(paths.run_config)
    assert config.sandbox.defaults()["limits"] == {"workspace_mb": 4, "total_memory_mb": 256, "processes": 256}
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "shell", "instance": {
        "commands": ["dd if=/dev/zero of=big bs=1M count=16 2>&1"], "expect": "No space left"}}]))
    drain_with_a_worker(paths, timeout=120)
    [row] = rows(paths)
    assert row["status"] == "ok" and row["reward"] == 1.0


@pytest.mark.parametrize("keep", [False, True])
def test_finished_workspaces_are_removed_after_the_row_unless_kept(tmp_path: Path, keep: bool) -> None:
    paths = make_run(tmp_path / "run", **{"sandbox.runtime": "local", "sandbox.keep_workspaces": keep})
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "shell", "instance": {
        "commands": ["echo result > out.txt"], "expect": ""}}]))
    worker = start_worker(paths, "--runtime", "local")
    try:
        wait_drained(paths, timeout=120)
    finally:
        assert stop_worker(worker) == 0
    assert [r["status"] for r in rows(paths)] == ["ok"]
    left = [p.name for p in paths.job_dir(report.first_job).glob("workspace*")] if paths.job_dir(report.first_job).exists() else []
    if keep:
        assert len(left) == 1 and (paths.job_dir(report.first_job) / left[0] / "out.txt").read_text() == "result\n"
    else:
        assert left == []

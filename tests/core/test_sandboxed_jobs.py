"""Jobs with real bubblewrap sandboxes through real workers: INIT opens the sandbox, RUN uses it,
it is closed before EVAL, and a SIGKILLed worker leaves no sandbox behind."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.spool.events import events_of
from orchestrator.submission.submit import submit_file
from tests.core.util import make_run, rows, start_worker, stop_worker, wait_drained, wait_until, write_jsonl
from tests.sandbox.helpers import sandbox_processes

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (scripts/test.sh installs it)")


@pytest.fixture
def node_dirs() -> Iterator[tuple[Path, dict[str, str]]]:
    base = Path(tempfile.mkdtemp(prefix="hrw-", dir="/tmp"))
    env = {"HPC_ROLLOUT_RUNTIME_DIR": str(base / "rt"), "HPC_ROLLOUT_LOOPBACK_DIR": str(base / "lo")}
    yield base, env
    leftovers = sandbox_processes(base)
    for pid, _ in leftovers:
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)
    assert not leftovers, f"sandboxes left behind: {leftovers}"


def test_sandbox_lives_from_init_to_the_end_of_run(tmp_path: Path, node_dirs: tuple[Path, dict[str, str]]) -> None:
    base, env = node_dirs
    paths = make_run(tmp_path / "run")
    tasks = [{"handler": "shell", "instance": {"commands": [f"echo job{i} > f.txt", "cat f.txt"], "expect": f"job{i}"}}
             for i in range(4)]
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", tasks))
    worker = start_worker(paths, "--runtime", "bwrap", "--run-pool", "2", env=env)
    try:
        wait_drained(paths, timeout=120)
    finally:
        assert stop_worker(worker) == 0
    got = rows(paths)
    assert len(got) == 4 and {(r["status"], r["reward"]) for r in got} == {("ok", 1.0)}
    for row in got:
        names = [e["event"] for e in events_of(paths, row["job_id"])]
        assert names.index("sandbox_started") < names.index("init_finished")
        last_command = len(names) - 1 - names[::-1].index("shell_command")
        assert names.index("run_started") < last_command < names.index("sandbox_closed") < names.index("eval_started")
    assert sandbox_processes(base) == []


def test_sigkilled_worker_leaves_no_sandbox(tmp_path: Path, node_dirs: tuple[Path, dict[str, str]]) -> None:
    base, env = node_dirs
    paths = make_run(tmp_path / "run", **{"jobs.timeout_s": 4.0})
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "shell", "instance": {"commands": ["sleep 60"]}}] * 2))
    victim = start_worker(paths, "--runtime", "bwrap", env=env)
    wait_until(lambda: len(sandbox_processes(base)) >= 2, 60, "two live sandboxes")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    successor = start_worker(paths, "--runtime", "bwrap", env=env)  # sweeps at start, recovers the claims
    try:
        wait_drained(paths, timeout=120)
    finally:
        assert stop_worker(successor) == 0
    wait_until(lambda: sandbox_processes(base) == [], 20, "no sandbox left")
    got = rows(paths)
    assert len(got) == 2 and {r["attempt"] for r in got} == {2}
    assert {r["status"] for r in got} == {"timeout"}  # `sleep 60` overruns the 4 s budget, twice

"""`launch --local --wait` owns its workers: the signals that reach it (Ctrl-C, SIGTERM, SIGHUP to its
process group) are passed on to them, and workers whose launcher died outright leave once the
queue is empty. Real launcher and worker processes throughout."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO

import pytest

from orchestrator.report.status import pending_count
from orchestrator.spool.paths import SpoolPaths
from tests.core.util import make_run, rows, wait_until, write_jsonl

CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def process_gone(pid: int) -> bool:
    """Exited (a zombie waiting for a parent that will never reap it counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


class Launcher:
    """`hpc-rollout launch RUN --local --wait --json` in a session of its own (as a shell job is)."""

    def __init__(self, paths: SpoolPaths, workers: int, *extra: str) -> None:
        self.paths = paths
        self.stderr_path = paths.root / f"launcher-{time.monotonic_ns()}.err"
        self._stderr: IO[bytes] = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(
            [*CLI, "launch", str(paths.root), "--local", "--workers", str(workers), "--wait", "--json", *extra],
            stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True, text=True)
        assert self.process.stdout is not None
        self.started = json.loads(self.process.stdout.readline())
        self.pids: list[int] = self.started["pids"]

    def wait(self, timeout: float) -> tuple[int, dict[str, object], str]:
        try:
            stdout, _ = self.process.communicate(timeout=timeout)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
                self.kill_workers()
            self._stderr.close()
        outcome = json.loads(stdout.strip().splitlines()[-1])
        return self.process.returncode, outcome, self.stderr_path.read_text()

    def kill_workers(self) -> None:
        for pid in self.pids:
            if not process_gone(pid):
                os.killpg(pid, signal.SIGKILL)


def running_jobs(paths: SpoolPaths) -> int:
    return sum(1 for claims in paths.active.iterdir() if claims.is_dir() for _ in claims.iterdir()) \
        if paths.active.is_dir() else 0


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP to the group"])
def test_sigterm_or_sighup_drain_the_workers_and_leave_none(tmp_path: Path, how: str) -> None:
    paths = make_run(tmp_path / "run", **{"shutdown.grace_s": 30.0, "jobs.batch_size": 1})
    write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 1.5}}] * 8)
    subprocess.run([*CLI, "submit", str(paths.root), str(tmp_path / "t.jsonl")], check=True, capture_output=True)
    launcher = Launcher(paths, 2, "--run-pool", "1", "--init-pool", "1")
    wait_until(lambda: len(rows(paths)) >= 1, 120, "a first row")
    if how == "SIGTERM":
        launcher.process.send_signal(signal.SIGTERM)
    else:
        os.killpg(launcher.process.pid, signal.SIGHUP)   # a dropped ssh session: the whole job gets it
    code, outcome, stderr = launcher.wait(timeout=60)
    assert code == 130, stderr
    assert outcome["exit_code"] == 130 and outcome["interrupted_by"] == [how.split()[0]], outcome
    assert all(process_gone(pid) for pid in launcher.pids), "no worker may outlive the drain"
    assert "interrupted" in stderr and "draining" in stderr, stderr
    finished = rows(paths)
    assert all(row["status"] == "ok" for row in finished), "running jobs finished within the grace period"
    assert len(finished) + pending_count(paths) == 8 and pending_count(paths) > 0, "the rest went back to the queue"
    assert running_jobs(paths) == 0


def test_a_second_sigint_returns_running_work_at_once(tmp_path: Path) -> None:
    grace_s = 60.0
    paths = make_run(tmp_path / "run", **{"shutdown.grace_s": grace_s})
    write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 300}}] * 2)
    subprocess.run([*CLI, "submit", str(paths.root), str(tmp_path / "t.jsonl")], check=True, capture_output=True)
    launcher = Launcher(paths, 1)
    events = paths.events
    wait_until(lambda: any("run_started" in p.read_text() for p in events.glob("*.jsonl")), 120, "RUN to start")
    launcher.process.send_signal(signal.SIGINT)
    time.sleep(2.0)
    assert launcher.process.poll() is None, "the first Ctrl-C drains: running jobs get the grace period"
    second = time.monotonic()
    launcher.process.send_signal(signal.SIGINT)
    code, outcome, stderr = launcher.wait(timeout=grace_s)
    took = time.monotonic() - second
    assert code == 130 and outcome["interrupted_by"] == ["SIGINT", "SIGINT"], stderr
    assert took < grace_s / 2, f"the second Ctrl-C took {took:.1f} s"
    assert all(process_gone(pid) for pid in launcher.pids)
    assert rows(paths) == [] and pending_count(paths) == 2, "both jobs are back in the queue, none ran to a row"
    assert "again" in stderr, stderr


def test_workers_of_a_killed_launcher_finish_the_queue_and_leave(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 0.5}}] * 6)
    subprocess.run([*CLI, "submit", str(paths.root), str(tmp_path / "t.jsonl")], check=True, capture_output=True)
    launcher = Launcher(paths, 2)
    try:
        os.killpg(launcher.process.pid, signal.SIGKILL)   # nothing can be passed on
        launcher.process.wait()
        wait_until(lambda: len(rows(paths)) == 6, 120, "every job to finish without its launcher")
        wait_until(lambda: all(process_gone(pid) for pid in launcher.pids), 60, "the workers to leave")
    finally:
        launcher.kill_workers()
    assert sorted(row["status"] for row in rows(paths)) == ["ok"] * 6
    logs = "".join(p.read_text() for p in Path(launcher.started["log_dir"]).glob("worker-*.log"))
    assert "launcher that waited on this worker is gone" in logs, logs[-2000:]


def test_a_detached_launch_says_how_its_workers_end(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    done = subprocess.run([*CLI, "launch", str(paths.root), "--local", "--json"], capture_output=True, text=True,
                          timeout=120)
    started = json.loads(done.stdout)
    try:
        assert "hpc-rollout stop" in started["ends"]
        wait_until(lambda: any(paths.workers.glob("*.json")), 60, "the first worker's heartbeat")
        human = subprocess.run([*CLI, "launch", str(paths.root), "--local"], capture_output=True, text=True, timeout=120)
        assert f"hpc-rollout stop {paths.root}" in human.stdout and "--idle-exit" in human.stdout, human.stdout
        assert "already working on this run" in human.stderr and started["launch_id"] in human.stderr, human.stderr
    finally:
        # at once after the second launch: its worker, still starting, must not take this stop for an old one
        stopped = subprocess.run([*CLI, "stop", str(paths.root), "--timeout", "30"], capture_output=True, text=True,
                                 timeout=120)
    assert stopped.returncode == 0 and "all workers stopped" in stopped.stdout, stopped.stdout + stopped.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is installed by scripts/test.sh")
def test_a_closed_terminal_drains_the_workers_and_leaves_none(tmp_path: Path) -> None:
    """The dropped ssh session for real: the launcher prints to a terminal that goes away (tmux
    kills the session: SIGHUP, then writes fail); its workers still drain and none is left."""
    paths = make_run(tmp_path / "run", **{"shutdown.grace_s": 30.0, "jobs.batch_size": 1})
    write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 1.5}}] * 8)
    subprocess.run([*CLI, "submit", str(paths.root), str(tmp_path / "t.jsonl")], check=True, capture_output=True)
    socket = f"hpc-rollout-test-{uuid.uuid4().hex[:8]}"   # a private tmux server
    command = " ".join(shlex.quote(a) for a in [*CLI, "launch", str(paths.root), "--local", "--workers", "2", "--wait",
                                                "--run-pool", "1", "--init-pool", "1"])
    subprocess.run(["tmux", "-L", socket, "new-session", "-d", "-s", "launch", "-x", "120", "-y", "40", command], check=True)
    pids: list[int] = []
    try:
        wait_until(lambda: len(rows(paths)) >= 1, 120, "a first row")
        pids = json.loads(next(paths.logs.glob("local-*/pids.json")).read_text())["pids"]
        subprocess.run(["tmux", "-L", socket, "kill-server"], check=True)
        wait_until(lambda: all(process_gone(pid) for pid in pids), 60, "the workers to drain and exit")
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
        for pid in pids:
            if not process_gone(pid):
                os.killpg(pid, signal.SIGKILL)
    finished = rows(paths)
    assert all(row["status"] == "ok" for row in finished)
    assert len(finished) + pending_count(paths) == 8 and pending_count(paths) > 0, "drained, not run to the end"
    logs = "".join(p.read_text() for p in paths.logs.glob("local-*/worker-*.log"))
    assert "SIGTERM received: draining" in logs, logs[-2000:]

"""A stop signal that arrives while a worker is still starting (the interpreter, imports, config:
a second or more on a busy node) is a clean stop, not a death by signal: `launch --wait` sends
SIGTERM to every worker once the queues drain, and a worker that was slow to start must still
exit 0 (a -15 among the exit codes reads as a crash)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from orchestrator.app.local_launch import start_local_workers
from orchestrator.worker.options import WorkerOptions
from tests.core.util import make_run


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_workers_signalled_right_after_launch_exit_zero(tmp_path: Path, signum: int) -> None:
    paths = make_run(tmp_path / "run")
    launch = start_local_workers(paths, 2, WorkerOptions())
    for process in launch.processes:   # at once: before Python in them has run a line of ours
        process.send_signal(signum)
    codes = [process.wait(timeout=120) for process in launch.processes]
    logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in launch.log_dir.glob("worker-*.log"))
    assert codes == [0, 0], logs

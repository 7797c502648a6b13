"""`status --watch` in a real terminal (tmux): it redraws in place while jobs finish, and Ctrl-C ends it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.submission.submit import submit_rows
from tests.core.util import make_run, start_worker, stop_worker, wait_until


def _tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is installed by scripts/test.sh")
def test_watch_redraws_in_place(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"pools.run": 2})
    submit_rows(paths, [(i, {"handler": "sleep", "instance": {"run": 0.4}}) for i in range(1, 31)])
    socket = f"hpc-rollout-test-{uuid.uuid4().hex[:8]}"   # a private tmux server, not anyone else's
    command = f"{sys.executable} -c 'from orchestrator.cli import main; main()' status {paths.root} --watch --interval 0.3"
    _tmux(socket, "new-session", "-d", "-s", "watch", "-x", "160", "-y", "70", command)
    worker = start_worker(paths)
    try:
        seen: set[int] = set()

        def finished_on_screen() -> int | None:
            screen = _tmux(socket, "capture-pane", "-p", "-t", "watch")
            assert screen.count(f"run {paths.root}") <= 1, f"status scrolled instead of redrawing:\n{screen}"
            found = re.search(r"finished: ok\s*│\s*(\d+)", screen)
            if found:
                seen.add(int(found.group(1)))
            return int(found.group(1)) if found else None

        wait_until(lambda: finished_on_screen() == 30, 120, "the screen to show 30 finished jobs")
        assert len(seen) >= 2, f"the screen never changed while jobs finished: {seen}"
        screen = _tmux(socket, "capture-pane", "-p", "-t", "watch")
        assert "reward mean 1" in screen and "time per stage" in screen, screen
        _tmux(socket, "send-keys", "-t", "watch", "C-c")
        # The session ends with its command: gone means `status --watch` exited on Ctrl-C.
        wait_until(lambda: subprocess.run(["tmux", "-L", socket, "has-session", "-t", "watch"],
                                          capture_output=True).returncode != 0, 30, "status --watch to exit on Ctrl-C")
    finally:
        stop_worker(worker)
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)

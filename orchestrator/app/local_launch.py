"""Starting worker processes on this machine, watching them drain, stopping them.

The processes run exactly what a Slurm array task runs (`python -m orchestrator.worker`).
Each gets its own session (process group), its pid recorded under logs/LAUNCH/, so it can be
stopped by pid and never by name. Workers a launcher `owns` (it waits on them: `launch --wait`,
`demo`) are told its pid: should it die without passing a signal on (orchestrator/app/
signal_relay.py), they leave once nothing is left to claim instead of running on unwatched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from orchestrator.spool.launches import launch_log_dir, new_launch_id, request_stop, stop_seen_env
from orchestrator.spool.paths import SpoolPaths
from orchestrator.worker.options import WorkerOptions
from orchestrator.worker.signals import STOP_NOW_SIGNAL, stop_signals_held

__all__ = ["LocalLaunch", "launch_log_dir", "new_launch_id", "request_stop", "start_local_workers"]


@dataclass
class LocalLaunch:
    launch_id: str
    log_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.processes if p.poll() is None]

    def drain(self) -> None:
        """Every worker stops claiming and finishes or returns running work within its grace period."""
        for process in self.alive():
            _signal_group(process, signal.SIGTERM)

    def stop_now(self) -> None:
        """Every worker returns running work to the queues at once and exits."""
        for process in self.alive():
            _signal_group(process, STOP_NOW_SIGNAL)

    def wait(self, timeout_s: float) -> list[int | None]:
        """Wait for every worker to exit; SIGKILL the process group of any still there past `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        return [p.returncode for p in self.processes]

    def terminate(self, timeout_s: float) -> list[int | None]:
        """SIGTERM every worker (they drain), SIGKILL their process group past `timeout_s`."""
        self.drain()
        return self.wait(timeout_s)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)  # the worker leads its own session: its pgid is its pid
    except ProcessLookupError:
        pass


def start_local_workers(paths: SpoolPaths, count: int, options: WorkerOptions, verbose: int = 1,
                        owned: bool = False) -> LocalLaunch:
    """`count` worker processes; `owned`: this process waits on them (they leave should it die)."""
    launch_id = options.launch_id or new_launch_id("local")
    log_dir = launch_log_dir(paths, launch_id)
    launch = LocalLaunch(launch_id, log_dir)
    options = _with_launch(options, launch_id)
    if owned:
        options = replace(options, launcher_pid=os.getpid())
    args = [sys.executable, "-m", "orchestrator.worker", str(paths.root), *options.to_args()]
    args += ["-v"] * verbose
    env = {**os.environ, **stop_seen_env(paths)}
    for index in range(count):
        log_path = log_dir / f"worker-{index}.log"
        with open(log_path, "ab") as log_file, stop_signals_held():
            process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            )
        launch.processes.append(process)
    (log_dir / "pids.json").write_bytes(orjson.dumps({"pids": launch.pids, "argv": args}))
    return launch


def _with_launch(options: WorkerOptions, launch_id: str) -> WorkerOptions:
    return replace(options, launch_id=launch_id)

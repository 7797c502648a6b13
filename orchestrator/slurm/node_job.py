"""NodeWorker: what every Slurm task of node workers runs, one node worker per task, however the
task was submitted: `launch --nodes` (submitit unpickles it and calls it) and a script rendered by
`sbatch render worker` (`python -m orchestrator.slurm.node_job RUN_DIR ...`) run this same code,
with the same preemption handling.

The worker runs in a thread; the main thread owns the signals (in a submitit task our handlers
replace submitit's, so both paths react alike):
- the warning signal (USR2 by default; Slurm sends it before a preemption or the time limit):
  stop with grace 0 (every claim goes back to its queue at once), then `scontrol requeue` this
  task only and exit. The requeued task resumes from the spool: nothing to carry.
- SIGTERM (scancel, `scontrol requeue`, the end of a preemption grace time) comes without a
  warning: return the claims at once too, so other nodes need not wait for the lease, but keep
  the task alive: the warning signal may still follow, and otherwise Slurm's SIGKILL ends it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from types import FrameType
from typing import Any

from orchestrator.slurm.cluster import run_slurm
from orchestrator.slurm.errors import SlurmError
from orchestrator.slurm.options import DEFAULT_SIGNAL
from orchestrator.spool.launches import array_started_at
from orchestrator.spool.paths import SpoolPaths
from orchestrator.worker.main import WorkerController, run_worker
from orchestrator.worker.options import WorkerOptions
from orchestrator.worker.signals import signals_received_early

log = logging.getLogger(__name__)

JOIN_POLL_S = 0.5            # the main thread wakes this often so signal handlers run promptly
WARNED_JOIN_TIMEOUT_S = 60.0
AFTER_TERM_WAIT_S = 300.0    # after SIGTERM, wait this long for the warning signal or SIGKILL


class WorkerFailed(SlurmError):
    """The node worker exited non-zero: the array task must end FAILED, not linger."""


def this_task() -> str:
    """The Slurm id of the running task: ARRAY_TASK for an array task, else the job id."""
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{index}" if array and index else os.environ.get("SLURM_JOB_ID", "")


class NodeWorker:
    """One node worker in one Slurm task. `submitted_at`: when launch submitted it (None from a
    rendered script: then the array's first start, as Slurm resets a requeued job's SubmitTime)."""

    def __init__(self, run_dir: str, options: WorkerOptions, task_index: int,
                 submitted_at: float | None = None, warning_signal: str = DEFAULT_SIGNAL) -> None:
        self.run_dir = run_dir
        self.options = options
        self.task_index = task_index      # global index across split arrays
        self.submitted_at = submitted_at
        self.warning_signal = warning_signal
        self._controller: WorkerController | None = None
        self._thread: threading.Thread | None = None
        self._terminated = False
        self._warned = False

    def stop_requested(self) -> bool:
        """`hpc-rollout stop` ran after this launch: a task starting late (throttled, requeued) must not serve."""
        paths = SpoolPaths.of(self.run_dir)
        launched = self.submitted_at
        if launched is None:
            array = array_of(this_task())
            launched = array_started_at(paths, array) if array else time.time()
        try:
            return paths.stop_request.stat().st_mtime >= launched
        except FileNotFoundError:
            return False

    def __call__(self) -> int:
        task = this_task()
        log.warning("node worker %s: task %s on %s, restart %s", self.task_index, task,
                    os.environ.get("SLURMD_NODENAME", socket.gethostname()), os.environ.get("SLURM_RESTART_COUNT", "0"))
        if self.stop_requested():
            log.warning("node worker %s: the run was stopped after this launch; not starting", self.task_index)
            return 0
        controller = WorkerController()
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["code"] = run_worker(
                    SpoolPaths.of(self.run_dir), self.options, controller, install_signal_handlers=False
                )
            except BaseException as exc:  # reported by the main thread below
                outcome["error"] = exc

        self._controller = controller
        self._install_signal_handlers()
        self._thread = threading.Thread(target=target, name="node-worker", daemon=True)
        self._thread.start()
        while self._thread.is_alive():
            self._thread.join(JOIN_POLL_S)
        if self._warned:
            self._requeue(task)
        if self._terminated:
            # Ending now would read as "completed": wait for the warning signal or Slurm's kill.
            deadline = time.monotonic() + AFTER_TERM_WAIT_S
            while time.monotonic() < deadline and not self._warned:
                time.sleep(JOIN_POLL_S)
            if self._warned:
                self._requeue(task)
            raise WorkerFailed(f"node worker {self.task_index}: SIGTERM and no kill after {AFTER_TERM_WAIT_S:.0f}s")
        if "error" in outcome:
            raise WorkerFailed(f"node worker {self.task_index} crashed: {outcome['error']!r}") from outcome["error"]
        code = int(outcome.get("code", 1))
        if code != 0:
            raise WorkerFailed(f"node worker {self.task_index} exited with status {code}; see its events")
        return code

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return   # (a test calling it from a thread): only the main thread may set handlers
        warning = signal.Signals["SIG" + self.warning_signal]
        if warning != signal.SIGTERM:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(warning, self._on_warning)
        for early in signals_received_early():   # while Python was still starting (rendered script)
            if early == warning:
                self._on_warning(early, None)

    def _on_warning(self, signum: int, frame: FrameType | None) -> None:
        """Preempted or out of time: return every claim now; requeue once the worker is out."""
        log.warning("node worker %s: warning signal %s, returning claims", self.task_index, self.warning_signal)
        self._warned = True
        if self._controller is not None:
            self._controller.stop(0.0, reason=signal.Signals(signum).name)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        log.warning("node worker %s: SIGTERM, returning claims now", self.task_index)
        self._terminated = True
        if self._controller is not None:
            self._controller.stop(0.0, reason="SIGTERM")

    def _requeue(self, task: str) -> None:
        if self._thread is not None:
            self._thread.join(WARNED_JOIN_TIMEOUT_S)
        log.warning("node worker %s: warning signal %s: claims returned, requeueing %s",
                    self.task_index, self.warning_signal, task)
        try:
            run_slurm(["scontrol", "requeue", task])
        except SlurmError as exc:
            raise WorkerFailed(f"node worker {self.task_index}: could not requeue {task}: {exc}") from exc
        raise SystemExit(0)   # the task is requeued: no result to report (submitit writes none either)

    def __getstate__(self) -> dict[str, Any]:
        # Threads and controllers live only in the running process.
        return {"run_dir": self.run_dir, "options": self.options, "task_index": self.task_index,
                "submitted_at": self.submitted_at, "warning_signal": self.warning_signal}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["run_dir"], state["options"], state["task_index"],  # type: ignore[misc]
                      state["submitted_at"], state.get("warning_signal", DEFAULT_SIGNAL))

    def __repr__(self) -> str:
        return f"NodeWorker({self.run_dir!r}, task {self.task_index})"


def array_of(task: str) -> str:
    return task.split("_", 1)[0]

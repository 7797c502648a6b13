"""NodeWorker: what each Slurm array task runs (through submitit), one node worker per task.

The worker runs in a thread because submitit owns the main thread's signals: on the warning
signal (USR2 by default) submitit calls `checkpoint()`, which stops the worker with grace 0
(every claim goes back to its queue at once) and hands submitit a fresh NodeWorker to requeue
in place of this array task only. The restarted task resumes from the spool: nothing to carry.

SIGTERM (scancel, `scontrol requeue`, the end of a preemption grace time) comes without a
warning signal; submitit ignores it. We return the claims at once too, so other nodes need not
wait for the lease, but keep the task alive: the warning signal may still follow (then submitit
requeues us), and otherwise Slurm's SIGKILL ends the task after KillWait.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission

from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.errors import SlurmError
from orchestrator.slurm.submitit_adapter import job_warning_signal
from orchestrator.worker.main import WorkerController, run_worker
from orchestrator.worker.options import WorkerOptions

log = logging.getLogger(__name__)

JOIN_POLL_S = 0.5            # the main thread wakes this often so signal handlers run promptly
PREEMPT_JOIN_TIMEOUT_S = 60.0
AFTER_TERM_WAIT_S = 300.0    # after SIGTERM, wait this long for the warning signal or SIGKILL


class WorkerFailed(SlurmError):
    """The node worker exited non-zero: the array task must end FAILED, not linger."""


class NodeWorker(Checkpointable):
    def __init__(self, run_dir: str, options: WorkerOptions, task_index: int,
                 submitted_at: float | None = None) -> None:
        self.run_dir = run_dir
        self.options = options
        self.task_index = task_index      # global index across split arrays
        self.submitted_at = time.time() if submitted_at is None else submitted_at
        self._controller: WorkerController | None = None
        self._thread: threading.Thread | None = None
        self._terminated = False

    def stop_requested(self) -> bool:
        """`hpc-rollout stop` ran after this launch: a task starting late (throttled, requeued) must not serve."""
        try:
            return SpoolPaths.of(self.run_dir).stop_request.stat().st_mtime >= self.submitted_at
        except FileNotFoundError:
            return False

    def __call__(self) -> int:
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
        if job_warning_signal() != "TERM" and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._thread = threading.Thread(target=target, name="node-worker", daemon=True)
        self._thread.start()
        while self._thread.is_alive():
            self._thread.join(JOIN_POLL_S)
        if self._terminated:
            # Ending now would read as "completed": wait for submitit's requeue or Slurm's kill.
            deadline = time.monotonic() + AFTER_TERM_WAIT_S
            while time.monotonic() < deadline:
                time.sleep(JOIN_POLL_S)
            raise WorkerFailed(f"node worker {self.task_index}: SIGTERM and no kill after {AFTER_TERM_WAIT_S:.0f}s")
        if "error" in outcome:
            raise WorkerFailed(f"node worker {self.task_index} crashed: {outcome['error']!r}") from outcome["error"]
        code = int(outcome.get("code", 1))
        if code != 0:
            raise WorkerFailed(f"node worker {self.task_index} exited with status {code}; see its events")
        return code

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        log.warning("node worker %s: SIGTERM, returning claims now", self.task_index)
        self._terminated = True
        if self._controller is not None:
            self._controller.stop(0.0)

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """Preempted or out of time: return every claim now, then let submitit requeue this task."""
        log.warning("node worker %s: warning signal, returning claims and requeueing", self.task_index)
        if self._controller is not None:
            self._controller.stop(0.0)
        if self._thread is not None:
            self._thread.join(PREEMPT_JOIN_TIMEOUT_S)
        return DelayedSubmission(NodeWorker(self.run_dir, self.options, self.task_index, self.submitted_at))

    def __getstate__(self) -> dict[str, Any]:
        # Threads and controllers live only in the running process.
        return {"run_dir": self.run_dir, "options": self.options, "task_index": self.task_index,
                "submitted_at": self.submitted_at}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["run_dir"], state["options"], state["task_index"], state["submitted_at"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"NodeWorker({self.run_dir!r}, task {self.task_index})"

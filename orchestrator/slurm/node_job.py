"""NodeWorker: what each Slurm array task runs (through submitit), one node worker per task.

The worker runs in a thread because submitit owns the main thread's signals: on the warning
signal (USR2 by default) submitit calls `checkpoint()`, which stops the worker with grace 0
(every claim goes back to its queue at once) and hands submitit a fresh NodeWorker to requeue
in place of this array task only. The restarted task resumes from the spool: nothing to carry.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission

from orchestrator.paths import SpoolPaths
from orchestrator.slurm.errors import SlurmError
from orchestrator.worker.main import WorkerController, run_worker
from orchestrator.worker.options import WorkerOptions

log = logging.getLogger(__name__)

JOIN_POLL_S = 0.5            # the main thread wakes this often so signal handlers run promptly
PREEMPT_JOIN_TIMEOUT_S = 60.0


class WorkerFailed(SlurmError):
    """The node worker exited non-zero: the array task must end FAILED, not linger."""


class NodeWorker(Checkpointable):
    def __init__(self, run_dir: str, options: WorkerOptions, task_index: int) -> None:
        self.run_dir = run_dir
        self.options = options
        self.task_index = task_index      # global index across split arrays
        self._controller: WorkerController | None = None
        self._thread: threading.Thread | None = None

    def __call__(self) -> int:
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
        self._thread = threading.Thread(target=target, name="node-worker", daemon=True)
        self._thread.start()
        while self._thread.is_alive():
            self._thread.join(JOIN_POLL_S)
        if "error" in outcome:
            raise WorkerFailed(f"node worker {self.task_index} crashed: {outcome['error']!r}") from outcome["error"]
        code = int(outcome.get("code", 1))
        if code != 0:
            raise WorkerFailed(f"node worker {self.task_index} exited with status {code}; see its events")
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """Preempted or out of time: return every claim now, then let submitit requeue this task."""
        log.warning("node worker %s: warning signal, returning claims and requeueing", self.task_index)
        if self._controller is not None:
            self._controller.stop(0.0)
        if self._thread is not None:
            self._thread.join(PREEMPT_JOIN_TIMEOUT_S)
        return DelayedSubmission(NodeWorker(self.run_dir, self.options, self.task_index))

    def __getstate__(self) -> dict[str, Any]:
        # Threads and controllers live only in the running process.
        return {"run_dir": self.run_dir, "options": self.options, "task_index": self.task_index}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["run_dir"], state["options"], state["task_index"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"NodeWorker({self.run_dir!r}, task {self.task_index})"

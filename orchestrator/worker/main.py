"""Entry point of one worker process: signals, a thread-safe stop handle, the exit code."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from orchestrator.config import RunConfig
from orchestrator.paths import SpoolPaths
from orchestrator.worker.engine import Worker
from orchestrator.worker.options import WorkerOptions

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
# Preempted: every claim back at once. One signal, because two TERMs sent back to back can reach
# the process as one (standard signals do not queue) and leave it draining.
STOP_NOW_SIGNAL = signal.SIGUSR1


class WorkerController:
    """Stop a worker from another thread (e.g. submitit's checkpoint on preemption)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: Worker | None = None
        self._pending: float | None = None
        self._requested = False
        self.worker_id: str | None = None

    def attach(self, loop: asyncio.AbstractEventLoop, worker: Worker) -> None:
        with self._lock:
            self._loop, self._worker, self.worker_id = loop, worker, worker.worker_id
            if self._requested:
                loop.call_soon_threadsafe(worker.request_stop, self._pending)

    def stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; with grace_s=0 return every claim at once and exit."""
        with self._lock:
            self._requested, self._pending = True, grace_s
            if self._loop is not None and self._worker is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._worker.request_stop, grace_s)


def run_worker(
    paths: SpoolPaths,
    options: WorkerOptions,
    controller: WorkerController | None = None,
    install_signal_handlers: bool = True,
) -> int:
    """Run one worker until it is stopped; 0 after a clean stop, 1 when an essential part failed."""
    config = RunConfig.load(paths.run_config)

    async def main() -> int:
        worker = Worker(paths, config, options)
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for signum in (*STOP_SIGNALS, STOP_NOW_SIGNAL):
                loop.add_signal_handler(signum, _on_signal, worker, signum)
        if controller is not None:
            controller.attach(loop, worker)
        return await worker.serve()

    return asyncio.run(main())


def _on_signal(worker: Worker, signum: int) -> None:
    name = signal.Signals(signum).name
    now = worker.stopping.is_set() or signum == STOP_NOW_SIGNAL
    log.warning("%s received: %s", name, "stopping now" if now else f"draining (grace {worker.grace_s:g}s)")
    worker.events.emit("-", "signal", {"signal": name})
    worker.request_stop(0.0 if now else None)

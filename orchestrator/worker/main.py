"""Entry point of one worker process: signals, a thread-safe stop handle, the exit code."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from orchestrator.config import RunConfig
from orchestrator.spool.fs_record import check_lease
from orchestrator.spool import access
from orchestrator.spool.paths import SpoolPaths
from dataclasses import replace

from orchestrator.worker.engine import EXIT_LEASE_LOST, Worker
from orchestrator.worker.options import WorkerOptions
from orchestrator.worker.signals import STOP_NOW_SIGNAL, STOP_SIGNALS, signals_received_early

log = logging.getLogger(__name__)
# A worker that lost its lease starts again as a new worker in the same process, this many
# times at most: past that, something keeps stalling this process and it had better exit.
MAX_REJOINS = 5


class WorkerController:
    """Stop a worker from another thread (e.g. a Slurm node task's warning signal: slurm/node_job.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: Worker | None = None
        self._pending: float | None = None
        self._reason: str | None = None
        self._requested = False
        self.worker_id: str | None = None

    @property
    def requested(self) -> bool:
        return self._requested

    def attach(self, loop: asyncio.AbstractEventLoop, worker: Worker) -> None:
        with self._lock:
            self._loop, self._worker, self.worker_id = loop, worker, worker.worker_id
            if self._requested:
                loop.call_soon_threadsafe(_stop, worker, self._pending, self._reason)

    def stop(self, grace_s: float | None = None, reason: str | None = None) -> None:
        """Stop claiming; with grace_s=0 return every claim at once and exit. `reason`: the signal
        that asked for it, recorded in the worker's events as a signal the worker caught itself."""
        with self._lock:
            self._requested, self._pending, self._reason = True, grace_s, reason
            if self._loop is not None and self._worker is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(_stop, self._worker, grace_s, reason)


def run_worker(
    paths: SpoolPaths,
    options: WorkerOptions,
    controller: WorkerController | None = None,
    install_signal_handlers: bool = True,
) -> int:
    """Run one worker until it is stopped; 0 after a clean stop, 1 when an essential part failed,
    3 (EXIT_LEASE_LOST) when it lost its lease more than MAX_REJOINS times."""
    access.own_process()   # a worker process: its umask follows the run's modes too
    config = RunConfig.load(paths.run_config)
    check_lease(paths, config.leases)   # refused before anything is claimed (spool/fs_record.py)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        current: list[Worker] = []
        stop_requested: list[int] = []

        def on_signal(signum: int) -> None:
            stop_requested.append(signum)
            _on_signal(current[-1], signum)

        for rejoin in range(MAX_REJOINS + 1):
            incarnation = options if rejoin == 0 or options.worker_id is None \
                else replace(options, worker_id=f"{options.worker_id}-r{rejoin}")
            worker = Worker(paths, config, incarnation)
            current.append(worker)
            if install_signal_handlers and rejoin == 0:
                for signum in (*STOP_SIGNALS, STOP_NOW_SIGNAL):
                    loop.add_signal_handler(signum, on_signal, signum)
                for early in signals_received_early():   # while the worker was still starting
                    on_signal(early)
            if controller is not None:
                controller.attach(loop, worker)
            code = await worker.serve()
            if code != EXIT_LEASE_LOST or stop_requested or (controller is not None and controller.requested):
                return code
            log.warning("worker %s was fenced out; re-registering as a new worker (%d/%d)",
                        worker.worker_id, rejoin + 1, MAX_REJOINS)
        return EXIT_LEASE_LOST

    return asyncio.run(main())


def _stop(worker: Worker, grace_s: float | None, reason: str | None) -> None:
    if reason is not None:
        worker.events.emit("-", "signal", {"signal": reason})
    worker.request_stop(grace_s)


def _on_signal(worker: Worker, signum: int) -> None:
    name = signal.Signals(signum).name
    now = worker.stopping.is_set() or signum == STOP_NOW_SIGNAL
    log.warning("%s received: %s", name, "stopping now" if now else f"draining (grace {worker.grace_s:g}s)")
    worker.events.emit("-", "signal", {"signal": name})
    worker.request_stop(0.0 if now else None)

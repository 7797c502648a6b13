"""Entry point of one worker process: signals, a thread-safe stop handle, the exit code."""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import threading
from dataclasses import replace
from typing import Callable

from orchestrator.config import RunConfig
from orchestrator.spool.fs_record import check_lease
from orchestrator.spool import access
from orchestrator.spool.paths import SpoolPaths

from orchestrator.worker.engine import EXIT_LEASE_LOST, Worker
from orchestrator.worker.options import WorkerOptions
from orchestrator.worker.periodic import wait_or_timeout
from orchestrator.worker.state import fresh_worker_id
from orchestrator.worker.signals import STOP_NOW_SIGNAL, STOP_SIGNALS, signals_received_early

log = logging.getLogger(__name__)
# A worker that lost its lease starts again as a new worker in the same process, this many
# times at most: past that, something keeps stalling this process and it had better exit.
MAX_REJOINS = 5
# Waits between tries to register again on a spool that refuses the files (full, say).
REGISTER_RETRY_S = (0.2, 0.5, 1.0, 2.0)


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
        stop_seen = asyncio.Event()

        def on_signal(signum: int) -> None:
            stop_requested.append(signum)
            stop_seen.set()
            _on_signal(current[-1], signum)

        def asked_to_stop() -> bool:
            return bool(stop_requested) or (controller is not None and controller.requested)

        for rejoin in range(MAX_REJOINS + 1):
            if rejoin == 0:
                worker = Worker(paths, config, options)
            else:
                rejoined = await _register_again(paths, config, _incarnation(options, rejoin), asked_to_stop, stop_seen)
                if rejoined is None:
                    return EXIT_LEASE_LOST   # asked to stop before the spool had room for it
                worker = rejoined
            current.append(worker)
            if install_signal_handlers and rejoin == 0:
                for signum in (*STOP_SIGNALS, STOP_NOW_SIGNAL):
                    loop.add_signal_handler(signum, on_signal, signum)
                for early in signals_received_early():   # while the worker was still starting
                    on_signal(early)
            if controller is not None:
                controller.attach(loop, worker)
            code = await worker.serve()
            if code != EXIT_LEASE_LOST or asked_to_stop():
                return code
            log.warning("worker %s was fenced out; re-registering as a new worker (%d/%d)",
                        worker.worker_id, rejoin + 1, MAX_REJOINS)
        return EXIT_LEASE_LOST

    return asyncio.run(main())


def _incarnation(options: WorkerOptions, rejoin: int) -> WorkerOptions:
    """The options of the `rejoin`-th new worker of this process: its own id, fixed before it
    registers, so a registration tried again on a full spool reuses what the last try wrote."""
    worker_id = f"{options.worker_id}-r{rejoin}" if options.worker_id is not None else fresh_worker_id()
    return replace(options, worker_id=worker_id)


async def _register_again(paths: SpoolPaths, config: RunConfig, options: WorkerOptions,
                          asked_to_stop: Callable[[], bool], stop_seen: asyncio.Event) -> Worker | None:
    """A new worker in this process once the spool lets it register; None when asked to stop first.

    Registering writes a heartbeat, a claim directory, a journal: on a full (or failing) spool
    that fails, often right after the pause that cost the lease. The process waits for room
    rather than dying with a traceback (exit 1) while the rest of the node carries on."""
    for attempt in itertools.count():
        if asked_to_stop():
            return None
        try:
            return Worker(paths, config, options)
        except OSError as exc:
            wait = REGISTER_RETRY_S[min(attempt, len(REGISTER_RETRY_S) - 1)]
            if attempt == 0 or attempt % 20 == 0:
                log.warning("worker %s cannot register (%s); trying again until the spool takes it", options.worker_id, exc)
            await wait_or_timeout(stop_seen, wait)
    return None   # unreachable: itertools.count() never ends


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

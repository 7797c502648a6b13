"""An idle dispatcher woken the moment a ticket lands in its queue on this node (inotify).

Without it, an idle dispatcher of a small run notices a new ticket at its next stat of the queue
directory (dispatch.QUEUE_WATCH_S, 50 ms) and one of a large run at its next poll: a trainer that
submits a step and waits for its rows loses half of that on average every step. The watch sets
the stage's wake-up, as work of the worker's own does (an idle dispatcher's cached listing is
empty: its next claim lists the queue); the polls go on unchanged, since another node's tickets
raise nothing here (spool/dir_watch.py). A busy dispatcher ignores the wake-up until it is idle.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestrator.spool.dir_watch import DirWatch
from orchestrator.spool.jobs import Stage
from orchestrator.worker.state import WorkerState


class QueueWatch:
    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self._stage_of: dict[Path, Stage] = {}
        self._watch: DirWatch | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Watch the queue of every stage this worker runs (on the running event loop)."""
        state = self.state
        self._stage_of = {state.queue_of(stage): stage for stage in Stage if state.runs(stage)}
        watch = self._watch = DirWatch(self._stage_of)
        fd = watch.fileno()
        if fd is not None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(fd, self._on_change)

    def stop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is None:
            return
        fd = watch.fileno()
        if fd is not None and self._loop is not None:
            self._loop.remove_reader(fd)
        watch.close()

    def _on_change(self) -> None:
        if self._watch is None:
            return
        for queue in self._watch.changed():
            stage = self._stage_of.get(queue)
            if stage is not None:
                self.state.pools.wake[stage].set()

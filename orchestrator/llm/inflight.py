"""Tasks in flight per backend, shared by every worker of a run through the spool.

Each worker owns one file, `backends/inflight/<worker>.json`, rewritten atomically when its
counts change: {"worker": W, "node": N, "inflight": {url: n}, "assigned": {url: n}}. A worker
writes it at most once per WORKER_PUBLISH_S (a busy worker's counts change at every job; each
write is a create and a rename on the metadata server), and a change held back is written when
that period ends, so other workers' view is at most that old; going idle is written at once.
A reader sums the files of live workers only: a worker is alive while its heartbeat file
(`workers/<worker>.json`, refreshed by the worker engine) keeps changing as the reader sees it
(spool/lease.py), so a dead worker's counts vanish with its lease and nobody has to clean them up.
On a run of more than 16 workers the boards are not written: the heartbeat carries the same
counts (`InflightBoard.counts`) to the cluster summary (orchestrator/llm/load_view.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from orchestrator.config import DEFAULTS
from orchestrator.spool import fsops
from orchestrator.spool.lease import SIGHTINGS
from orchestrator.llm.files import write_json_atomic
from orchestrator.spool.paths import SpoolPaths, safe_name

log = logging.getLogger(__name__)

# A worker's board is rewritten at most this often (seconds). Routing picks the backend with the
# fewest tasks in flight; counts up to this old only matter for tasks that start within the
# same 50 ms on different workers, which the tie-breaks spread anyway.
WORKER_PUBLISH_S = 0.05


@dataclass(frozen=True)
class Load:
    """The cluster-wide view used for one routing decision."""

    inflight: dict[str, int]   # url -> tasks in flight on live workers (this one included)
    assigned: dict[str, int]   # url -> tasks ever assigned (lifetime, every worker file)
    live_workers: int


@dataclass
class InflightBoard:
    """This worker's own counts (kept in memory, mirrored to its file) and the cluster sum."""

    paths: SpoolPaths
    worker_id: str
    node: str = ""
    lease_s: float = DEFAULTS.leases.lease_s
    inflight: Counter[str] = field(default_factory=Counter)
    assigned: Counter[str] = field(default_factory=Counter)
    # 0: publish every change (a bare board outside a worker); WORKER_PUBLISH_S in a worker of a
    # small run (others read the boards at every decision); inf on a large run: others see the
    # counts through the heartbeat and the cluster summary only.
    publish_every_s: float = 0.0
    _published_at: float = field(default=-1e18, repr=False)
    _unpublished: bool = field(default=False, repr=False)
    _publish_scheduled: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        safe_name(self.worker_id, "worker id")

    @property
    def own_file(self) -> Path:
        return self.paths.backends_inflight / f"{self.worker_id}.json"

    def change(self, url: str, delta: int) -> None:
        """+1 when a task starts on `url`, -1 when it ends or leaves it; then publish."""
        self.inflight[url] += delta
        if self.inflight[url] <= 0:
            del self.inflight[url]
        if delta > 0:
            self.assigned[url] += delta
        self._unpublished = True
        if not self.inflight and math.isfinite(self.publish_every_s):
            self.publish()   # idle now: say so at once, or others would route around a phantom load
        else:
            self.publish_if_due()

    def publish_if_due(self) -> None:
        """Publish changes not yet published, now or when the publication period ends.

        In an event loop the write waits at least for the end of the loop's round: the tasks a
        batch of answers ends and starts together (every one in the same round) cost one write,
        not one each. A change within `publish_every_s` of the last write is written when that
        period ends (a timer of the loop), so it is never held back longer. Outside a loop (a
        script, a test) a due change is written now; one that is not due waits for the next
        call (the heartbeat makes one)."""
        if not self._unpublished or self._publish_scheduled:
            return
        wait_s = self._published_at + self.publish_every_s - time.monotonic()
        if math.isinf(wait_s):   # a large run: the heartbeat carries the counts
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if wait_s <= 0:
                self.publish()
            return
        self._publish_scheduled = True
        if wait_s <= 0:
            loop.call_soon(self._publish_scheduled_write)
        else:
            loop.call_later(wait_s, self._publish_scheduled_write)

    def _publish_scheduled_write(self) -> None:
        self._publish_scheduled = False
        if self._unpublished:
            self.publish()

    def undo(self, url: str) -> None:
        """Take back a +1 whose task never started on `url` (it failed its health check)."""
        self.assigned[url] -= 1
        if self.assigned[url] <= 0:
            del self.assigned[url]
        self.change(url, -1)

    def counts(self) -> dict[str, dict[str, int]]:
        """What the heartbeat carries to the cluster summary on a large run."""
        return {"inflight": dict(self.inflight), "assigned": dict(self.assigned)}

    def publish(self) -> None:
        """Write this worker's counts; a spool that cannot take them (full) only makes other
        workers' view stale until the next change: never a reason to fail a task."""
        self._published_at, self._unpublished = time.monotonic(), False
        try:
            write_json_atomic(
                self.own_file,
                {"worker": self.worker_id, "node": self.node, "updated_at": time.time(),
                 "inflight": dict(self.inflight), "assigned": dict(self.assigned)},
            )
        except OSError as exc:
            log.warning("in-flight counts of %s not published: %s", self.worker_id, exc)

    def read(self, now: float | None = None) -> Load:
        """The cluster view, with this worker's own counts taken from memory."""
        return read_load(self.paths, self.lease_s, now=now, own=self)


def _alive(heartbeat: str, lease_s: float) -> bool:
    """The worker's heartbeat changed within a lease as this process saw it (spool/lease.py): never
    its mtime against this node's clock."""
    identity = fsops.identity(Path(heartbeat))
    return identity is not None and not SIGHTINGS.silent(heartbeat, identity, lease_s)


@dataclass(frozen=True)
class WorkerCounts:
    """One worker's published counts, as a scan of the boards found them."""

    inflight: dict[str, int]
    assigned: dict[str, int]
    alive: bool


def scan_boards(paths: SpoolPaths, lease_s: float = DEFAULTS.leases.lease_s, *, now: float | None = None,
                skip: str = "") -> dict[str, WorkerCounts]:
    """Every worker's board (one open and one heartbeat stat each): 2 W + 1 metadata operations.
    (`now` is not used: liveness is judged by change, not by this node's clock.)

    Routing does not call this per decision on a large run: see orchestrator/llm/load_view.py.
    """
    workers_dir = str(paths.workers)  # plain strings: this loop is the hot part of a scan
    try:
        entries = list(os.scandir(paths.backends_inflight))
    except FileNotFoundError:
        entries = []
    fsops.listed(len(entries))
    found: dict[str, WorkerCounts] = {}
    for entry in entries:
        name = entry.name
        if not name.endswith(".json") or name.startswith("."):
            continue
        worker = name[: -len(".json")]
        if worker == skip:
            continue
        try:
            data = orjson.loads(fsops.read_bytes(Path(entry.path)))
        except (OSError, orjson.JSONDecodeError):
            continue  # vanished or being replaced: absent for this decision
        found[worker] = WorkerCounts(
            {url: int(n) for url, n in (data.get("inflight") or {}).items()},
            {url: int(n) for url, n in (data.get("assigned") or {}).items()},
            _alive(os.path.join(workers_dir, name), lease_s),
        )
    return found


def total_load(workers: dict[str, WorkerCounts], own: InflightBoard | None = None) -> Load:
    """Sum in-flight counts of live workers and lifetime assignments of all workers.

    `own` (the caller's board) is counted from memory and alive by definition; its published
    entry in `workers`, if any, is ignored.
    """
    inflight: Counter[str] = Counter(own.inflight if own else {})
    assigned: Counter[str] = Counter(own.assigned if own else {})
    live = 1 if own else 0
    for worker, counts in workers.items():
        if own is not None and worker == own.worker_id:
            continue
        assigned.update(counts.assigned)
        if counts.alive:
            live += 1
            inflight.update(counts.inflight)
    return Load(dict(inflight), dict(assigned), live)


def read_load(
    paths: SpoolPaths, lease_s: float = DEFAULTS.leases.lease_s, *, now: float | None = None,
    own: InflightBoard | None = None,
) -> Load:
    """The exact cluster view: every worker's board read now (2 W + 1 operations)."""
    return total_load(scan_boards(paths, lease_s, now=now, skip=own.worker_id if own else ""), own)

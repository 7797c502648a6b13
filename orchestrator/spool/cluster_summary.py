"""The cluster summary: what a worker of a large run knows about the others, from one file.

On a run of more than LARGE_RUN_WORKERS workers, polling the spool for what concerns everyone
(the others' load, cancel requests, a stop request, the backend registry, dead workers, whether
a shared queue holds anything) would cost the metadata server a few operations per node and
period: thousands per second at 1,000 nodes. Instead one worker at a time rebuilds
`control/cluster.json` from the heartbeats (which carry each worker's in-flight counts),
`cancel/`, `control/stop`, the registry's stat and the first name of each shared queue, and
every worker reads that one file about once per rebuild:

- a rebuild costs W + ~10 operations; whoever first finds the summary older than its rebuild
  period (W / REBUILD_OPS_PER_S seconds, at least `view_s`) and wins the lock rebuilds it, so
  the whole run spends at most ~REBUILD_OPS_PER_S operations per second on it;
- a reader re-reads it once per rebuild period (there is nothing newer to see before);
- the rebuilder has just read every heartbeat: it hands the dead workers it found to recovery
  (orchestrator/spool/recovery.py `reap_found`), so the other workers need not scan for them.

What a worker learns this way is up to two rebuild periods old (plus a heartbeat for the load
counts). Small runs never use it: their workers read the spool directly, exact and fast.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from orchestrator.config import DEFAULTS
from orchestrator.spool import fsops
from orchestrator.spool.cancel import read_requests
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.softlock import break_if_stale, try_soft_lock

log = logging.getLogger(__name__)

LARGE_RUN_WORKERS = 16      # beyond this many live workers a run reads the summary instead of the spool
REBUILD_OPS_PER_S = 250.0   # what the whole run spends on rebuilding the summary, at most
# A rebuild takes milliseconds to a few seconds: a lock older than a few rebuild periods belongs to a
# dead (or paused) rebuilder. Under half a lease, so the next rebuild comes before readers find the
# summary older than a lease and fall back to scanning the spool themselves.
STALE_LOCK_PERIODS = 3.0
STALE_LOCK_LEASE_SHARE = 0.4
# Summaries are stamped with the rebuilder's clock and judged by the reader's. NTP keeps a cluster's
# clocks within milliseconds; a summary dated more than this in the reader's future comes from a
# node whose clock runs fast, and would look fresh for as long as it runs ahead after that node
# died: it is treated as due (and not fresh) instead. 1 s is far above NTP's skew and small next
# to a lease, so it adds at most 1 s to how long a dead rebuilder's summary is believed.
CLOCK_SKEW_S = 1.0


@dataclass(frozen=True)
class WorkerState:
    """One worker as its heartbeat said at the last rebuild."""

    alive: bool
    node: str
    inflight: dict[str, int]     # backend url -> tasks in flight (the heartbeat's "load")
    assigned: dict[str, int]     # backend url -> tasks ever assigned
    fills_run_queue: bool        # prepares jobs it cannot run (`--stages init`): its node's run queue fills


@dataclass(frozen=True)
class Summary:
    """`control/cluster.json` as of `built_at`."""

    built_at: float
    workers: dict[str, WorkerState]
    cancel_names: tuple[str, ...] = ()      # the names in cancel/
    cancel_all_before: float = 0.0          # the time in cancel/ALL, if any
    stop_at: float | None = None            # mtime of control/stop
    registry_key: tuple[int, int, int] | None = None   # (inode, mtime_ns, size) of backends.json
    queued: dict[str, bool] = field(default_factory=dict)   # shared queue name -> holds a ticket
    swept_at: float = 0.0                   # the last rebuild that also did recovery's rare duties

    @property
    def alive(self) -> int:
        return sum(w.alive for w in self.workers.values())

    @property
    def large(self) -> bool:
        return self.alive > LARGE_RUN_WORKERS

    def rebuild_due(self, now: float, view_s: float) -> bool:
        return now - self.built_at >= rebuild_period_s(self.alive, view_s) or self.from_future(now)

    def from_future(self, now: float) -> bool:
        """Built by a node whose clock runs ahead of this one's (see CLOCK_SKEW_S)."""
        return self.built_at - now > CLOCK_SKEW_S

    def nodes_filling_run_queues(self) -> set[str]:
        return {w.node for w in self.workers.values() if w.alive and w.fills_run_queue}

    def to_json(self) -> dict[str, Any]:
        return {
            "built_at": self.built_at, "cancel_names": list(self.cancel_names),
            "cancel_all_before": self.cancel_all_before, "stop_at": self.stop_at,
            "registry_key": list(self.registry_key) if self.registry_key else None,
            "queued": self.queued, "swept_at": self.swept_at,
            "workers": {w: {"alive": s.alive, "node": s.node, "inflight": s.inflight, "assigned": s.assigned,
                            "fills_run_queue": s.fills_run_queue} for w, s in self.workers.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Summary":
        """Every field coerced to its type: a damaged file raises (ValueError, TypeError, ...) here,
        where the reader treats it as absent, not later in whoever uses the field."""
        key, stop_at = data.get("registry_key"), data.get("stop_at")
        return cls(
            built_at=float(data["built_at"]),
            workers={str(w): WorkerState(bool(s.get("alive")), str(s.get("node", "")), _int_counts(s.get("inflight")),
                                         _int_counts(s.get("assigned")), bool(s.get("fills_run_queue")))
                     for w, s in (data.get("workers") or {}).items()},
            cancel_names=tuple(str(name) for name in data.get("cancel_names") or ()),
            cancel_all_before=float(data.get("cancel_all_before") or 0.0),
            stop_at=None if stop_at is None else float(stop_at),
            registry_key=(int(key[0]), int(key[1]), int(key[2])) if key else None,
            queued={str(k): bool(v) for k, v in (data.get("queued") or {}).items()},
            swept_at=float(data.get("swept_at") or 0.0),
        )


@dataclass(frozen=True)
class Rebuild:
    """What the process that rebuilt the summary found on the way (for recovery)."""

    summary: Summary
    dead: dict[str, dict | None]   # dead worker -> the shard progress its last heartbeat carried
    sweep: bool                    # time for recovery's rare duties (about once per lease for the run)
    listed: frozenset[str] = frozenset()   # every heartbeat listed in workers/, read or not
    moved: int = 0                 # claims the recovery hook returned to queues (ClusterView.refresh)


def rebuild_period_s(workers: int, view_s: float) -> float:
    """A rebuild costs about W operations: one per W / REBUILD_OPS_PER_S seconds keeps the run's total flat."""
    return max(view_s, workers / REBUILD_OPS_PER_S)


def registry_key(paths: SpoolPaths) -> tuple[int, int, int] | None:
    """What says the backend registry changed: one stat."""
    fsops.count("stat")
    try:
        st = paths.backends.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def build_summary(paths: SpoolPaths, lease_s: float, now: float, previous: Summary | None = None) -> Rebuild:
    """Read every heartbeat (one open each; its mtime from the open file), cancel/, control/stop,
    the registry's stat and the first name of each shared queue: W + ~6 operations.

    Never raises on a heartbeat's content: a damaged one would otherwise stop every rebuilder in turn."""
    workers: dict[str, WorkerState] = {}
    dead: dict[str, dict | None] = {}
    try:
        entries = [e for e in os.scandir(paths.workers) if e.name.endswith(".json") and not e.name.startswith(".")]
    except FileNotFoundError:
        entries = []
    fsops.listed(len(entries))
    for entry in entries:
        fsops.count("open")
        try:
            with open(entry.path, "rb") as handle:
                changed = os.fstat(handle.fileno()).st_mtime
                info = orjson.loads(handle.read())
        except (OSError, orjson.JSONDecodeError):
            continue   # being replaced or retired: absent from this summary
        info = info if isinstance(info, dict) else {}
        worker, alive = entry.name[: -len(".json")], now - changed < lease_s
        load = info.get("load") if isinstance(info.get("load"), dict) else {}
        pools = info.get("pools") if isinstance(info.get("pools"), dict) else {}
        workers[worker] = WorkerState(
            alive, str(info.get("node", "")), _counts(load.get("inflight")), _counts(load.get("assigned")),
            _size(pools, "run") == 0 and _size(pools, "init") > 0,
        )
        if not alive:
            dead[worker] = info.get("shards") if isinstance(info.get("shards"), dict) else None
    cancel_names, all_before = read_requests(paths)
    # a sweep dated in this node's future (by a fast clock) must not put the next one off
    sweep = previous is None or now - previous.swept_at >= lease_s or previous.swept_at - now > CLOCK_SKEW_S
    summary = Summary(
        built_at=now, workers=workers, cancel_names=tuple(sorted(cancel_names)), cancel_all_before=all_before,
        stop_at=fsops.mtime(paths.stop_request), registry_key=registry_key(paths), queued=shared_queues_queued(paths),
        swept_at=now if sweep else previous.swept_at if previous else 0.0,
    )
    listed = frozenset(entry.name[: -len(".json")] for entry in entries)
    return Rebuild(summary, dead, sweep, listed)


def shared_queues_queued(paths: SpoolPaths) -> dict[str, bool]:
    """Whether each shared queue holds a ticket: one listing each, stopped at the first name."""
    return {q.name: fsops.has_entries(q) for q in (paths.init_queue, paths.eval_queue)}


def _int_counts(value: Any) -> dict[str, int]:
    return {str(url): int(n) for url, n in (value or {}).items()}


def _counts(value: Any) -> dict[str, int]:
    """A heartbeat's per-backend counts; none when they are malformed (the worker still counts)."""
    try:
        return _int_counts(value) if isinstance(value, dict) else {}
    except (TypeError, ValueError, OverflowError):
        return {}


def _size(pools: dict[str, Any], stage: str) -> int:
    pool = pools.get(stage)
    try:
        return int(pool.get("size") or 0) if isinstance(pool, dict) else 0
    except (TypeError, ValueError, OverflowError):
        return 0


@dataclass
class ClusterView:
    """One process's copy of the summary, re-read once per rebuild period, rebuilt when due."""

    paths: SpoolPaths
    lease_s: float
    view_s: float = DEFAULTS.llm.view_s   # re-read the summary at most this often ([llm] view_s)
    summary: Summary | None = field(default=None, repr=False)
    _read_at: float = field(default=-1e18, repr=False)

    @property
    def lock_file(self) -> Any:
        return self.paths.cluster_summary.with_name(self.paths.cluster_summary.name + ".lock")

    def read_period(self) -> float:
        return rebuild_period_s(self.summary.alive if self.summary else 0, self.view_s)

    def stale_lock_s(self) -> float:
        return min(STALE_LOCK_PERIODS * self.read_period(), STALE_LOCK_LEASE_SHARE * self.lease_s)

    def fresh(self, now: float | None = None) -> Summary | None:
        """The summary if it describes a large run and is younger than a lease (else poll the spool)."""
        now = time.time() if now is None else now
        summary = self.summary
        if summary is None or not summary.large or now - summary.built_at >= self.lease_s or summary.from_future(now):
            return None
        return summary

    def registry_key(self) -> tuple[int, int, int] | None:
        """The registry file's identity as the fresh summary saw it (BackendRegistry.vouch): a
        registry change then reaches this process within two rebuild periods, without a stat per read."""
        summary = self.fresh()
        return summary.registry_key if summary is not None else None

    def refresh(self, now: float | None = None, recover: Callable[[Rebuild], int] | None = None) -> Rebuild | None:
        """Re-read the summary when a newer one may exist; rebuild it if it is due and nobody else
        is on it. The rebuild's findings when this process rebuilt, None otherwise.

        `recover` (recovery.reap_found) runs on the findings before the summary is written, so the
        queue hints it writes count the claims it returned to the queues (`Rebuild.moved`)."""
        now = time.time() if now is None else now
        if self.view_s <= 0 or (self.summary is not None and now - self._read_at < self.read_period()):
            return None
        self._read_at = now
        current = self._read()
        if current is None or current.rebuild_due(now, self.view_s):
            rebuilt = self._rebuild_if_first(now, current, recover)
            if rebuilt is not None:
                self.summary = rebuilt.summary
                return rebuilt
        if current is not None:
            self.summary = current
        return None

    def _rebuild_if_first(self, now: float, previous: Summary | None,
                          recover: Callable[[Rebuild], int] | None = None) -> Rebuild | None:
        lock = try_soft_lock(self.lock_file)
        if lock is None:
            break_if_stale(self.lock_file, self.stale_lock_s())
            return None
        try:
            rebuilt = build_summary(self.paths, self.lease_s, now, previous)
            moved = recover(rebuilt) if recover is not None else 0
            if moved:
                summary = replace(rebuilt.summary, queued=shared_queues_queued(self.paths))
                rebuilt = replace(rebuilt, summary=summary, moved=moved)
            try:
                fsops.write_atomic(self.paths.cluster_summary, orjson.dumps(rebuilt.summary.to_json()),
                                   self.paths.tmp, fsops.Durability.NONE)
            except OSError as exc:   # a full spool: this process still has its fresh view
                log.warning("cluster summary not written: %s", exc)
            return rebuilt
        finally:
            lock.release()   # only if still ours: a paused rebuilder's lock may have been broken and retaken

    def _read(self) -> Summary | None:
        try:
            return Summary.from_json(orjson.loads(fsops.read_bytes(self.paths.cluster_summary)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None

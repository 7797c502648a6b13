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

No clock of another node is compared with this one's (spool/lease.py). A summary is a new one
when its (generation, builder) changes; a reader finds it fresh while it changed within a lease,
and due for a rebuild once it stayed the same for a rebuild period, both on the reader's own
monotonic clock. Whether a worker is dead is judged by what the rebuilders saw stay the same
(`CarriedJudge`): each rebuild writes, for every heartbeat (and claim directory, run queue) it
judged, its identity and for how long it had been seen unchanged; the next rebuilder adds the
time it has itself seen that summary unchanged, so the count goes on across rebuilders (a lower
bound: never longer than the truth) and a dead worker is found a lease after it stopped.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from orchestrator.config import DEFAULTS
from orchestrator.spool import fsops
from orchestrator.spool.cancel import read_requests
from orchestrator.spool.lease import SIGHTINGS, Sightings, break_if_stale, new_holder, try_lock
from orchestrator.spool.paths import SpoolPaths

log = logging.getLogger(__name__)

LARGE_RUN_WORKERS = 16      # beyond this many live workers a run reads the summary instead of the spool
REBUILD_OPS_PER_S = 250.0   # what the whole run spends on rebuilding the summary, at most
# A rebuild takes milliseconds to a few seconds: a lock unchanged for a few rebuild periods belongs to
# a dead (or paused) rebuilder. Under half a lease, so the next rebuild comes before readers find the
# summary unchanged for a lease and fall back to scanning the spool themselves.
STALE_LOCK_PERIODS = 3.0
STALE_LOCK_LEASE_SHARE = 0.4

Identity = tuple[int, ...]


@dataclass(frozen=True)
class WorkerSummary:
    """One worker as its heartbeat said at the last rebuild."""

    alive: bool
    node: str
    inflight: dict[str, int]     # backend url -> tasks in flight (the heartbeat's "load")
    assigned: dict[str, int]     # backend url -> tasks ever assigned
    fills_run_queue: bool        # prepares jobs it cannot run (`--stages init`): its node's run queue fills


@dataclass(frozen=True)
class Summary:
    """`control/cluster.json`: what one rebuild found."""

    built_at: float                         # the rebuilder's clock: shown, never compared with another
    workers: dict[str, WorkerSummary]
    generation: int = 0                     # with `builder`: what says this is another summary
    builder: str = ""
    cancel_names: tuple[str, ...] = ()      # the names in cancel/
    cancel_all: frozenset[str] = frozenset()   # the submissions cancel/ALL covers
    stop_key: Identity | None = None        # control/stop's identity (inode, mtime_ns, size), if any
    registry_key: tuple[int, int, int] | None = None   # (inode, mtime_ns, size) of backends.json
    queued: dict[str, bool] = field(default_factory=dict)   # shared queue name -> holds a ticket
    since_sweep_s: float = 0.0              # since recovery's rare duties last ran, as rebuilders saw it
    # What the rebuilders judged (a path under the run, relative): its identity, and for how long
    # it had been seen unchanged (CarriedJudge).
    sightings: dict[str, tuple[Identity, float]] = field(default_factory=dict)

    @property
    def version(self) -> tuple[int, str]:
        return (self.generation, self.builder)

    @property
    def alive(self) -> int:
        return sum(w.alive for w in self.workers.values())

    @property
    def large(self) -> bool:
        return self.alive > LARGE_RUN_WORKERS

    def nodes_filling_run_queues(self) -> set[str]:
        return {w.node for w in self.workers.values() if w.alive and w.fills_run_queue}

    def to_json(self) -> dict[str, Any]:
        return {
            "built_at": self.built_at, "generation": self.generation, "builder": self.builder,
            "cancel_names": list(self.cancel_names), "cancel_all": sorted(self.cancel_all),
            "stop_key": list(self.stop_key) if self.stop_key else None,
            "registry_key": list(self.registry_key) if self.registry_key else None,
            "queued": self.queued, "since_sweep_s": self.since_sweep_s,
            "sightings": {key: [list(identity), unchanged] for key, (identity, unchanged) in self.sightings.items()},
            "workers": {w: {"alive": s.alive, "node": s.node, "inflight": s.inflight, "assigned": s.assigned,
                            "fills_run_queue": s.fills_run_queue} for w, s in self.workers.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Summary":
        """Every field coerced to its type: a damaged file raises (ValueError, TypeError, ...) here,
        where the reader treats it as absent, not later in whoever uses the field."""
        key, stop_key = data.get("registry_key"), data.get("stop_key")
        return cls(
            built_at=float(data["built_at"]),
            workers={str(w): WorkerSummary(bool(s.get("alive")), str(s.get("node", "")), _int_counts(s.get("inflight")),
                                         _int_counts(s.get("assigned")), bool(s.get("fills_run_queue")))
                     for w, s in (data.get("workers") or {}).items()},
            generation=int(data.get("generation") or 0), builder=str(data.get("builder") or ""),
            cancel_names=tuple(str(name) for name in data.get("cancel_names") or ()),
            cancel_all=frozenset(str(name) for name in data.get("cancel_all") or ()),
            stop_key=tuple(int(part) for part in stop_key) if stop_key is not None else None,
            registry_key=(int(key[0]), int(key[1]), int(key[2])) if key else None,
            queued={str(k): bool(v) for k, v in (data.get("queued") or {}).items()},
            since_sweep_s=float(data.get("since_sweep_s") or 0.0),
            sightings={str(k): (tuple(int(part) for part in v[0]), float(v[1]))
                       for k, v in (data.get("sightings") or {}).items()},
        )


@dataclass
class CarriedJudge:
    """A rebuilder's judgement of what stayed the same: the longer of what it saw itself and what
    the last summary carried plus the time this rebuilder has seen that summary unchanged.

    Both are lower bounds of the truth (a summary's count only covers time before it was built),
    measured by each rebuilder on its own monotonic clock: no two clocks are ever compared."""

    root: Path
    own: Sightings
    carried: dict[str, tuple[Identity, float]]
    elapsed_s: float
    found: dict[str, tuple[Identity, float]] = field(default_factory=dict)   # for the next summary

    def unchanged_for(self, key: Hashable, signature: Hashable) -> float:
        mine = self.own.unchanged_for(key, signature)
        label = os.path.relpath(str(key), self.root)
        before = self.carried.get(label)
        theirs = before[1] + self.elapsed_s if before is not None and before[0] == signature else 0.0
        unchanged = max(mine, theirs)
        if isinstance(signature, tuple):
            self.found[label] = (signature, unchanged)
        return unchanged

    def silent(self, key: Hashable, signature: Hashable, lease_s: float) -> bool:
        return self.unchanged_for(key, signature) >= lease_s


@dataclass(frozen=True)
class Rebuild:
    """What the process that rebuilt the summary found on the way (for recovery)."""

    summary: Summary
    dead: dict[str, dict | None]   # dead worker -> the shard progress its last heartbeat carried
    sweep: bool                    # time for recovery's rare duties (about once per lease for the run)
    judge: CarriedJudge            # what recovery judges the rest with (its findings go into the summary)
    listed: frozenset[str] = frozenset()   # every heartbeat listed in workers/, read or not
    moved: int = 0                 # claims the recovery hook returned to queues (ClusterView.refresh)


def rebuild_period_s(workers: int, view_s: float) -> float:
    """A rebuild costs about W operations: one per W / REBUILD_OPS_PER_S seconds keeps the run's total flat."""
    return max(view_s, workers / REBUILD_OPS_PER_S)


def registry_key(paths: SpoolPaths) -> tuple[int, int, int] | None:
    """What says the backend registry changed: one stat."""
    return fsops.identity(paths.backends)


def _stop_identity(paths: SpoolPaths) -> Identity | None:
    """control/stop's identity, looked up after its directory is revalidated (fsops.refresh_dir):
    a stop written on another node is in this summary, not one attribute cache time later."""
    fsops.refresh_dir(paths.control)
    return fsops.identity(paths.stop_request)


def build_summary(paths: SpoolPaths, lease_s: float, judge: CarriedJudge | None = None,
                  previous: Summary | None = None, builder: str = "") -> Rebuild:
    """Read every heartbeat (one open each; its identity from the open file), cancel/, control/stop,
    the registry's stat and the first name of each shared queue: W + ~6 operations.

    Never raises on a heartbeat's content: a damaged one would otherwise stop every rebuilder in turn."""
    judge = judge or CarriedJudge(paths.root, SIGHTINGS, {}, 0.0)
    workers: dict[str, WorkerSummary] = {}
    dead: dict[str, dict | None] = {}
    try:
        entries = [e for e in os.scandir(paths.workers) if e.name.endswith(".json") and not e.name.startswith(".")]
    except FileNotFoundError:
        entries = []
    fsops.listed(len(entries))
    for entry in entries:
        try:
            data, st = fsops.read_regular(Path(entry.path))
            info = orjson.loads(data)
        except (OSError, orjson.JSONDecodeError):
            continue   # being replaced or retired: absent from this summary
        info = info if isinstance(info, dict) else {}
        worker = entry.name[: -len(".json")]
        alive = not judge.silent(entry.path, (st.st_ino, st.st_mtime_ns, st.st_size), lease_s)
        raw_load, raw_pools = info.get("load"), info.get("pools")
        load: dict[str, Any] = raw_load if isinstance(raw_load, dict) else {}
        pools: dict[str, Any] = raw_pools if isinstance(raw_pools, dict) else {}
        workers[worker] = WorkerSummary(
            alive, str(info.get("node", "")), _counts(load.get("inflight")), _counts(load.get("assigned")),
            _size(pools, "run") == 0 and _size(pools, "init") > 0,
        )
        if not alive:
            dead[worker] = info.get("shards") if isinstance(info.get("shards"), dict) else None
    cancel_names, cancel_all = read_requests(paths)
    since_sweep = previous.since_sweep_s + judge.elapsed_s if previous is not None else float("inf")
    sweep = since_sweep >= lease_s
    summary = Summary(
        built_at=time.time(), workers=workers, generation=(previous.generation + 1 if previous else 1),
        builder=builder, cancel_names=tuple(sorted(cancel_names)), cancel_all=cancel_all,
        stop_key=_stop_identity(paths), registry_key=registry_key(paths),
        queued=shared_queues_queued(paths), since_sweep_s=0.0 if sweep else since_sweep,
    )
    listed = frozenset(entry.name[: -len(".json")] for entry in entries)
    return Rebuild(summary, dead, sweep, judge, listed)


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
    """One process's copy of the summary, re-read once per rebuild period, rebuilt when due.

    Every time here is this process's monotonic clock (`clock`)."""

    paths: SpoolPaths
    lease_s: float
    view_s: float = DEFAULTS.llm.view_s   # re-read the summary at most this often ([llm] view_s)
    clock: Callable[[], float] = time.monotonic
    sightings: Sightings = field(default_factory=lambda: SIGHTINGS, repr=False)
    summary: Summary | None = field(default=None, repr=False)
    _read_at: float = field(default=-1e18, repr=False)
    _seen_since: float = field(default=-1e18, repr=False)   # when this process first saw `summary`'s version

    @property
    def lock_file(self) -> Any:
        return self.paths.cluster_summary.with_name(self.paths.cluster_summary.name + ".lock")

    def read_period(self) -> float:
        return rebuild_period_s(self.summary.alive if self.summary else 0, self.view_s)

    def stale_lock_s(self) -> float:
        return min(STALE_LOCK_PERIODS * self.read_period(), STALE_LOCK_LEASE_SHARE * self.lease_s)

    def unchanged_s(self) -> float:
        """How long this process has seen the same summary."""
        return self.clock() - self._seen_since

    def fresh(self) -> Summary | None:
        """The summary if it describes a large run and changed within a lease (else poll the spool)."""
        summary = self.summary
        if summary is None or not summary.large or self.unchanged_s() >= self.lease_s:
            return None
        return summary

    def registry_key(self) -> tuple[int, int, int] | None:
        """The registry file's identity as the fresh summary saw it (BackendRegistry.vouch): a
        registry change then reaches this process within two rebuild periods, without a stat per read."""
        summary = self.fresh()
        return summary.registry_key if summary is not None else None

    def refresh(self, recover: Callable[[Rebuild], int] | None = None) -> Rebuild | None:
        """Re-read the summary when a newer one may exist; rebuild it if it is due and nobody else
        is on it. The rebuild's findings when this process rebuilt, None otherwise.

        `recover` (recovery.reap_found) runs on the findings before the summary is written, so the
        queue hints it writes count the claims it returned to the queues (`Rebuild.moved`)."""
        now = self.clock()
        if self.view_s <= 0 or (self.summary is not None and now - self._read_at < self.read_period()):
            return None
        self._read_at = now
        current = self._read()
        if current is not None and (self.summary is None or current.version != self.summary.version):
            self.summary, self._seen_since = current, now
        due = current is None or now - self._seen_since >= rebuild_period_s(current.alive, self.view_s)
        if due:
            rebuilt = self._rebuild_if_first(current, recover)
            if rebuilt is not None:
                self.summary, self._seen_since = rebuilt.summary, self.clock()
                return rebuilt
        return None

    def _rebuild_if_first(self, previous: Summary | None, recover: Callable[[Rebuild], int] | None) -> Rebuild | None:
        holder = new_holder()
        lock = try_lock(self.lock_file, holder)
        if lock is None:
            break_if_stale(self.lock_file, self.stale_lock_s(), self.sightings)
            return None
        try:
            elapsed = self.clock() - self._seen_since if previous is not None else 0.0
            judge = CarriedJudge(self.paths.root, self.sightings, previous.sightings if previous else {}, elapsed)
            rebuilt = build_summary(self.paths, self.lease_s, judge, previous, holder)
            moved = recover(rebuilt) if recover is not None else 0
            summary = replace(rebuilt.summary, sightings=dict(judge.found))
            if moved:
                summary = replace(summary, queued=shared_queues_queued(self.paths))
            rebuilt = replace(rebuilt, summary=summary, moved=moved)
            try:
                fsops.write_atomic(self.paths.cluster_summary, orjson.dumps(summary.to_json()),
                                   self.paths.tmp, fsops.Durability.NONE)
            except OSError as exc:   # a full spool: this process still has its fresh view
                log.warning("cluster summary not written: %s", exc)
            return rebuilt
        finally:
            lock.release()   # only our own token: a paused rebuilder's lock may have been broken and retaken

    def _read(self) -> Summary | None:
        try:
            return Summary.from_json(orjson.loads(fsops.read_bytes(self.paths.cluster_summary)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None

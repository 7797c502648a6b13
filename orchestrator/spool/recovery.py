"""Returning the claims of workers whose lease expired (crashed, SIGKILLed, node lost).

Any live worker may do this. Exactly one wins each dead worker: the first to rename
active/DEAD to active/.reap-DEAD--ME. Tickets go back to the queue of the stage they were in
with attempt + 1; past the maximum they end `failed`. Rows the dead worker already committed
are recognised by job id, so no job ends twice.

A worker is dead when its heartbeat stayed the same for a lease as the judge saw it, on the
judge's own clock (spool/lease.py `Sightings`; the judge is the scanning worker, or on a large
run the cluster summary's rebuilders, whose sightings the summary carries). Likewise a claim
directory without a heartbeat, and a node's run queue without a live worker, are judged by
whether they changed. No judgement compares a time written by another node with this one's.

An attempt lost with its worker's lease is charged to the job only once that worker is known
dead: a worker that comes back and finds its claims gone (fenced: paused, partitioned) leaves
`workers/fenced/W`, and attempts lost with it are never charged. The loss being counted now
cannot be known yet (its worker may still come back), so it is not charged either: a job that
kills every worker it runs on is given up after max_attempts + 1 runs.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Callable

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.access import owners_of, read_trusted
from orchestrator.spool.batches import decode_batch, is_batch
from orchestrator.spool.cluster_summary import LARGE_RUN_WORKERS, Rebuild
from orchestrator.spool.jobs import StageError
from orchestrator.spool.handoffs import read_handoffs
from orchestrator.spool.jobs import Stage
from orchestrator.spool.journal import JournalEntry, read as read_journal, resume_journaled
from orchestrator.spool.lease import SIGHTINGS, Judge, Sightings
from orchestrator.spool.liveness import heartbeat_key, read_workers, retire, was_fenced
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shardlog import WriterDirectory, writers_of_worker
from orchestrator.spool.shards import committed_job_ids
from orchestrator.spool.tickets import CorruptTicket, Ticket

log = logging.getLogger(__name__)
Emit = Callable[[str, str, dict], None]
REAP_PREFIX = ".reap-"
RING_ABOVE = LARGE_RUN_WORKERS   # beyond, a scan checks its ring successors instead of every heartbeat
# A ring scan walks on past successors it sees for the first time (they tell nothing yet), at most
# this many per scan: a run of dead neighbours is then found RING_LOOKAHEAD a lease, not one.
RING_LOOKAHEAD = 8


def reap_expired(paths: SpoolPaths, me: str, lease_s: float, max_attempts: int, emit: Emit,
                 rng: random.Random | None = None, seen: Callable[[int], None] | None = None,
                 sightings: Sightings | None = None) -> int:
    """Return expired workers' claims to their queues; the number of tickets moved.

    Up to RING_ABOVE workers every heartbeat is read (a full scan, 2 W + a few operations).
    Beyond, each worker checks its successors in the sorted ring of heartbeat names until it
    finds a live one (usually one stat), so every dead worker is found by the live worker
    before it within a scan period; the rarer duties of a full scan (claims with no heartbeat
    at all, run queues of nodes with no live worker) are done by a random worker now and then,
    about one full scan per lease for the whole run. `seen` is told how many heartbeats there are.
    `sightings`: the judge's memory of what it saw (a worker keeps its own; default: this process's).
    """
    judge = sightings or SIGHTINGS
    names = sorted(n[: -len(".json")] for n in fsops.list_names(paths.workers) if n.endswith(".json"))
    if seen is not None:
        seen(len(names))
    if len(names) <= RING_ABOVE or (rng or random).random() < 1 / (3 * len(names)):
        return _full_scan(paths, me, lease_s, max_attempts, emit, judge)
    return _ring_scan(paths, me, names, lease_s, max_attempts, emit, judge)


def _ring_scan(paths: SpoolPaths, me: str, names: list[str], lease_s: float, max_attempts: int, emit: Emit,
               judge: Sightings) -> int:
    ring = sorted(set(names) | {me})
    start = ring.index(me)
    moved = 0
    first_sights = 0
    for step in range(1, len(ring)):
        worker = ring[(start + step) % len(ring)]
        key = heartbeat_key(paths, worker)
        first = not judge.known(key)
        identity = fsops.identity(paths.heartbeat(worker))
        if identity is not None and not judge.silent(key, identity, lease_s):
            if first and first_sights < RING_LOOKAHEAD:
                first_sights += 1
                continue   # seen for the first time: it tells nothing yet, look further
            break
        progress = _heartbeat_progress(paths.heartbeat(worker))
        moved += _reap_worker(paths, worker, me, max_attempts, emit, progress)
        close_dead_writers(paths, worker, progress)
        retire(paths, worker)
    listed = set(names) | {me}
    moved += _reap_claims_without_heartbeat(paths, listed, me, lease_s, max_attempts, emit, judge)
    moved += _resume_abandoned_reaps(paths, me, listed, max_attempts, emit)
    return moved


def _full_scan(paths: SpoolPaths, me: str, lease_s: float, max_attempts: int, emit: Emit, judge: Sightings) -> int:
    workers = read_workers(paths, lease_s, judge)
    alive = {w.worker_id for w in workers if w.alive} | {me}
    moved = 0
    for worker in workers:
        if not worker.alive and worker.worker_id != me:
            moved += _reap_worker(paths, worker.worker_id, me, max_attempts, emit, worker.info.get("shards"))
            close_dead_writers(paths, worker.worker_id, worker.info.get("shards"))
            retire(paths, worker.worker_id)
    moved += _reap_claims_without_heartbeat(paths, {w.worker_id for w in workers} | {me}, me, lease_s, max_attempts,
                                            emit, judge)
    moved += _resume_abandoned_reaps(paths, me, alive, max_attempts, emit)
    moved += _rescue_orphaned_run_queues(paths, {w.node for w in workers if w.alive}, lease_s, max_attempts, emit, judge)
    return moved


def reap_found(paths: SpoolPaths, me: str, lease_s: float, max_attempts: int, emit: Emit, rebuild: Rebuild) -> int:
    """Recovery by the worker that just rebuilt the cluster summary (large runs): it read every
    heartbeat, so it returns the dead workers' claims itself and the others need not scan.
    Once per lease for the run (`rebuild.sweep`) it also does a full scan's rarer duties."""
    moved = 0
    for worker, progress in rebuild.dead.items():
        if worker == me:
            continue
        moved += _reap_worker(paths, worker, me, max_attempts, emit, progress)
        close_dead_writers(paths, worker, progress)
        retire(paths, worker)
    if rebuild.sweep:
        workers = rebuild.summary.workers
        alive = {w for w, state in workers.items() if state.alive} | {me}
        # every listed heartbeat: one that could not be read this time (replaced mid-read) is no proof of death
        listed = set(rebuild.listed) | set(workers) | {me}
        moved += _reap_claims_without_heartbeat(paths, listed, me, lease_s, max_attempts, emit, rebuild.judge)
        moved += _resume_abandoned_reaps(paths, me, alive, max_attempts, emit)
        live_nodes = {state.node for state in workers.values() if state.alive}
        moved += _rescue_orphaned_run_queues(paths, live_nodes, lease_s, max_attempts, emit, rebuild.judge)
    return moved


def release_own_claims(paths: SpoolPaths, me: str, max_attempts: int, emit: Emit) -> int:
    """At a clean stop: the claim directory goes; anything still in it is requeued like a lost claim."""
    try:
        paths.claims(me).rmdir()
        return 0
    except FileNotFoundError:
        return 0
    except OSError:
        return _reap_worker(paths, me, me, max_attempts, emit)


def requeue_claim(paths: SpoolPaths, path: Path, reason: str, max_attempts: int, emit: Emit,
                  journal: dict[str, JournalEntry] | None = None) -> int:
    """A claim its worker could not carry on (an error in the engine): back to its queue, attempt + 1.

    `journal`: the worker's journal entries (progress not saved in the claim file)."""
    return _requeue_file(paths, path, reason, max_attempts, emit, journal=journal)


def _reap_claims_without_heartbeat(paths: SpoolPaths, known: set[str], me: str, lease_s: float,
                                   max_attempts: int, emit: Emit, judge: Judge) -> int:
    """Claim directories of workers with no heartbeat at all (stopped or retired with claims left).

    A worker writes its heartbeat before it creates its claim directory, so a directory with no
    heartbeat that has not changed for a lease (as the judge saw it) is nobody's.
    """
    moved = 0
    for owner in fsops.list_names(paths.active):
        if owner in known:
            continue
        identity = fsops.identity(paths.claims(owner))
        if identity is not None and judge.silent(str(paths.claims(owner)), identity, lease_s):
            moved += _reap_worker(paths, owner, me, max_attempts, emit)
            close_dead_writers(paths, owner, None)
    return moved


def close_dead_writers(paths: SpoolPaths, dead: str, progress: dict | None) -> int:
    """Close the shard writers a dead worker left open, so readers stop probing them.

    Only once its claim directory is gone (taken over above, or by another reaper): from then
    on it can commit nothing (shards are renamed out of that directory), so its last shard on
    disk is final. `progress` (its heartbeat's) names a shard known committed: the search for
    the last one starts there. The number of writers closed.
    """
    if fsops.mtime(paths.claims(dead)) is not None:
        return 0
    directory = WriterDirectory(paths)
    known = progress.get("dropped_through") if isinstance(progress, dict) else None
    closed = 0
    for writer in writers_of_worker(dead, directory.open()):
        at_least = known if isinstance(known, int) and progress.get("writer") == writer else 0   # type: ignore[union-attr]
        if directory.close_abandoned(writer, at_least):
            log.info("closed the shard writer %s of dead worker %s", writer, dead)
            closed += 1
    return closed


def _reap_worker(paths: SpoolPaths, dead: str, me: str, max_attempts: int, emit: Emit,
                 progress: dict | None = None) -> int:
    reap_dir = paths.active / f"{REAP_PREFIX}{dead}--{me}"
    if not fsops.rename(paths.claims(dead), reap_dir):
        return 0  # no claims, or another worker is on it
    return _return_claims(paths, reap_dir, dead, max_attempts, emit, progress)


def _resume_abandoned_reaps(paths: SpoolPaths, me: str, alive: set[str], max_attempts: int, emit: Emit) -> int:
    """A reaper that died (or failed: a full spool) mid-way leaves .reap-DEAD--REAPER: finish its work.

    Our own are from an earlier pass of this worker (passes do not overlap), so they count too.
    """
    moved = 0
    for entry in _hidden_entries(paths.active):
        if not entry.startswith(REAP_PREFIX):
            continue
        dead, _, reaper = entry[len(REAP_PREFIX):].rpartition("--")
        if reaper in alive and reaper != me:
            continue
        mine = paths.active / f"{REAP_PREFIX}{dead}--{me}"
        if fsops.rename(paths.active / entry, mine):
            progress = _retired_progress(paths, dead)
            moved += _return_claims(paths, mine, dead, max_attempts, emit, progress)
            close_dead_writers(paths, dead, progress)
    return moved


def _retired_progress(paths: SpoolPaths, dead: str) -> dict | None:
    """The shard progress in a dead worker's last heartbeat (already moved to workers/gone/)."""
    return _heartbeat_progress(paths.workers / "gone" / f"{dead}.json")


def _heartbeat_progress(heartbeat: Path) -> dict | None:
    """The shard progress (ShardWriter.progress) a heartbeat file carries, if any."""
    try:
        info = orjson.loads(fsops.read_bytes(heartbeat))
    except (OSError, orjson.JSONDecodeError):
        return None
    return info.get("shards") if isinstance(info, dict) else None


def _return_claims(paths: SpoolPaths, reap_dir: Path, dead: str, max_attempts: int, emit: Emit,
                   progress: dict | None = None) -> int:
    # Shards are committed by a rename out of the claim directory, so once it is renamed here
    # the dead worker can commit nothing more (fencing): what it committed is all there is.
    done = committed_job_ids(paths, dead, progress if isinstance(progress, dict) else None)
    lease_lost = not reap_dir.name.endswith(f"{dead}--{dead}")
    reason = f"worker {dead} lost (lease expired)" if lease_lost else f"left behind by worker {dead} when it stopped"
    entries = fsops.list_all_names(reap_dir)
    # What the claims did since they were saved (a RUN output before EVAL): read before any
    # claim is requeued. A record the fenced worker appends later is simply not seen.
    journal = read_journal(reap_dir, entries, paths.quarantine, owners_of(paths))
    moved = 0
    names = [name for name in entries if not name.startswith(".")]
    batches = [name for name in names if is_batch(name)]
    if batches:
        names = _expand_batches(paths, reap_dir, batches, set(names) - set(batches), done, reason)
    for name in names:
        path = reap_dir / name
        if name in done:  # its row is committed; only the unlink was lost
            fsops.unlink(path)
            continue
        moved += _requeue_file(paths, path, reason, max_attempts, emit, journal=journal,
                               lost_with=dead if lease_lost else None)
    for name in entries:  # the journal; a shard the fenced worker was writing: never committed
        if name.startswith("."):
            fsops.unlink(reap_dir / name)
    try:
        reap_dir.rmdir()
    except OSError:
        pass
    return moved


def _expand_batches(paths: SpoolPaths, reap_dir: Path, batches: list[str], singles: set[str], done: set[str],
                    reason: str) -> list[str]:
    """Turn the claimed batch files of `reap_dir` into tickets of their own there; the tickets to return.

    A job of a batch is already accounted for when its row is committed (`done`), when it has its
    own ticket here (written before it left: that ticket is the newer state), or when the
    hand-off log says it left as its own ticket (orchestrator/spool/handoffs.py). The others are written
    here as tickets and flushed before the batch file goes, so a reaper dying half-way leaves
    nothing lost and nothing twice: the next one finds the same jobs by the same rules.
    """
    handed_off = read_handoffs(reap_dir)
    tickets = set(singles)
    for name in batches:
        path = reap_dir / name
        try:
            data, refusal = read_trusted(paths, path)
            if refusal:   # never turned into tickets of ours: that would launder a stranger's jobs
                fsops.quarantine(path, paths.quarantine, f"{reason}; its batch {refusal}")
                continue
            jobs = decode_batch(data, name)
        except (CorruptTicket, UnicodeError) as exc:
            fsops.quarantine(path, paths.quarantine, f"{reason}; its batch {name} is corrupt: {exc}")
            continue
        for ticket in jobs:
            if ticket.name in done or ticket.name in handed_off or ticket.name in tickets:
                continue
            fsops.write_atomic(reap_dir / ticket.name, ticket.encode(), paths.tmp)
            tickets.add(ticket.name)
        fsops.sync_dir(reap_dir)
        fsops.unlink(path)
    return sorted(tickets)


def _requeue_file(paths: SpoolPaths, path: Path, reason: str, max_attempts: int, emit: Emit,
                  name: str | None = None, journal: dict[str, JournalEntry] | None = None,
                  lost_with: str | None = None) -> int:
    """Requeue the ticket held in `path` (a file only this process can see); 1 if requeued.

    A `journal` entry of the same attempt counts as if the ticket had been saved with it.
    `lost_with`: the worker whose lease expired with the claim (see `_count_loss`)."""
    name = name or path.name
    try:
        data, refusal = read_trusted(paths, path)
        if refusal:   # requeued, it would be rewritten as ours: a stranger's ticket must not be
            fsops.quarantine(path, paths.quarantine, f"{reason}; its ticket {refusal}")
            emit(name, "quarantined", {"reason": refusal})
            return 0
        ticket = Ticket.decode(data, name)
    except (CorruptTicket, UnicodeError) as exc:
        fsops.quarantine(path, paths.quarantine, f"{reason}; its ticket {name} is corrupt: {exc}")
        return 0
    resume_journaled(ticket, (journal or {}).get(name))
    queue = _count_loss(paths, ticket, reason, max_attempts, lost_with)
    # The new content replaces the held copy, then ONE rename moves it: a kill at any point leaves
    # the job in exactly one place (here, returned again by recovery, or queued), never both.
    fsops.write_atomic(path, ticket.encode(), paths.tmp)
    fsops.replace(path, queue / name)
    fsops.sync_dir(queue)
    emit(ticket.name, "requeued", {"reason": reason, "attempt": ticket.attempt, "to": queue.name})
    log.warning("job %s: %s; requeued to %s (attempt %d)", ticket.name, reason, queue.name, ticket.attempt)
    return 1


def _count_loss(paths: SpoolPaths, ticket: Ticket, reason: str, max_attempts: int, lost_with: str | None = None) -> Path:
    """Record the lost attempt (attempt + 1; `failed` past max_attempts); the queue it goes back to.

    Attempts lost with a worker's lease (`lost_with`) are charged only once that worker is known
    dead: not this one (it may yet come back), nor earlier ones whose worker came back fenced."""
    pending = 1 if lost_with else 0
    uncharged = pending
    if ticket.attempt + 1 - pending > max_attempts:   # only then can it matter: look for fenced workers
        uncharged += sum(1 for loss in ticket.history
                         if isinstance(loss.get("lease_of"), str) and was_fenced(paths, loss["lease_of"]))
    entry = {"t": time.time(), "lost": reason, "stage": ticket.stage.value, "attempt": ticket.attempt}
    ticket.history.append({**entry, "lease_of": lost_with} if lost_with else entry)
    ticket.count_lost_attempt(StageError(ticket.stage.value, "attempts_exhausted",
                                         f"{reason}; gave up after {max_attempts} attempts").to_record(),
                              max_attempts, uncharged)
    return paths.eval_queue if ticket.return_after_loss() is Stage.EVAL else paths.init_queue


def _rescue_orphaned_run_queues(
    paths: SpoolPaths, live_nodes: set[str], lease_s: float, max_attempts: int, emit: Emit, judge: Judge
) -> int:
    """Jobs prepared on a node where no worker lives any more cannot run there: back to INIT."""
    moved = 0
    for queue in paths.run_queues():
        node = queue.name[len("run@"):]
        if node in live_nodes:
            continue
        identity = fsops.identity(queue)
        if identity is None or not judge.silent(str(queue), identity, lease_s):
            continue  # changed within a lease as the judge saw it: a worker may be starting there
        for name in fsops.list_names(queue):
            grabbed = paths.tmp / f".rescue-{name}"
            if not fsops.rename(queue / name, grabbed):
                continue
            moved += _requeue_file(paths, grabbed, f"node {node} has no live worker", max_attempts, emit, name)
    return moved


def _hidden_entries(directory: Path) -> list[str]:
    return [n for n in fsops.list_all_names(directory) if n.startswith(".")]

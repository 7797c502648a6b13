"""What the workers did over wall time, from job events: stage intervals per worker slot,
jobs per place (queues, stages) over time, and rates.

Events carry no slot number: each worker's INIT, RUN and EVAL intervals are laid out on slots
greedily (an interval takes the lowest slot free at its start), which needs exactly as many
slots as the pool had busy at once: the same picture a slot number would give.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

STAGES = ("init", "run", "eval")
# Where a job is after an event; the order is the order of the depth/busy plots.
PLACES = ("init queue", "run queue", "eval queue", "INIT", "RUN", "EVAL", "done")
INIT_QUEUE, RUN_QUEUE, EVAL_QUEUE, IN_INIT, IN_RUN, IN_EVAL, DONE = range(len(PLACES))
NO_CHANGE = -1
LANES_LAID_OUT = 160   # worker slots placed on the timeline; further slots are only counted
JOB_EVENTS = (
    "init_started", "init_finished", "run_started", "run_finished", "eval_started", "eval_finished",
    "returned", "requeued", "finished",
)


@dataclass(frozen=True, eq=False)
class Intervals:
    """One row per stage execution: who ran it, on which slot, from when to when."""

    worker: np.ndarray     # str
    stage: np.ndarray      # index into STAGES
    start: np.ndarray      # epoch seconds
    end: np.ndarray
    open: np.ndarray       # bool: no end event (still running, or the worker died)
    slot: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    lanes: tuple[tuple[str, int, int], ...] = ()   # (worker, stage, slot) in display order

    def __len__(self) -> int:
        return len(self.start)

    def lane_index(self) -> np.ndarray:
        """Position of each interval's slot in `lanes`."""
        if not len(self):
            return np.zeros(0, int)
        names, worker_code = np.unique(self.worker.astype(str), return_inverse=True)
        first: dict[tuple[str, int], int] = {}
        for position, (worker, stage, _) in enumerate(self.lanes):
            first.setdefault((worker, stage), position)
        table = np.array([[first.get((str(name), stage), 0) for stage in range(len(STAGES))] for name in names])
        return np.where(self.slot >= 0, table[worker_code, self.stage] + self.slot, len(self.lanes))


@dataclass(frozen=True, eq=False)
class Occupancy:
    """Jobs per place as step functions: place i holds counts[i][j] jobs from times[i][j] on."""

    times: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]
    unknown_start: bool    # no submission records: queue depths start from what events show

    @property
    def empty(self) -> bool:
        return not any(len(t) for t in self.times)

    def at(self, grid: np.ndarray) -> np.ndarray:
        """Counts sampled on `grid` (shape (len(PLACES), len(grid)))."""
        sampled = np.zeros((len(PLACES), len(grid)))
        for place, (times, counts) in enumerate(zip(self.times, self.counts)):
            if len(times):
                index = np.searchsorted(times, grid, side="right") - 1
                sampled[place] = np.where(index >= 0, counts[np.clip(index, 0, None)], 0)
        return sampled


@dataclass(frozen=True, eq=False)
class JobEvents:
    """Job events as integer codes (one pass of Arrow encoding, shared by every analysis here)."""

    t: np.ndarray
    name: np.ndarray          # index into JOB_EVENTS, -1 for other events
    job: np.ndarray           # job code
    worker: np.ndarray        # worker code
    workers: np.ndarray       # worker names, by code
    stage: np.ndarray         # the `stage` field as an index into STAGES, -1 when absent
    to: np.ndarray            # the `to` field as a place (queue), -1 when absent
    has_status: np.ndarray    # the event carries a `status` (the stage ended the job)

    def __len__(self) -> int:
        return len(self.t)


def _encode(column: pa.ChunkedArray, known: dict[str, int] | None = None) -> tuple[np.ndarray, list[str]]:
    """(codes, dictionary); with `known`, codes are known[value] (-1 for anything else)."""
    encoded = pc.dictionary_encode(pc.fill_null(column, "").combine_chunks())
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    dictionary = encoded.dictionary.to_pylist()
    if known is None:
        return codes, dictionary
    mapping = np.array([known.get(value, -1) for value in dictionary] or [-1], np.int64)
    return mapping[codes], dictionary


def job_events(events: pa.Table) -> JobEvents:
    if not events.num_rows:
        empty = np.zeros(0, np.int64)
        return JobEvents(np.zeros(0), empty, empty, empty, np.array([], dtype=object), empty, empty, np.zeros(0, bool))
    name, _ = _encode(events.column("event"), {n: i for i, n in enumerate(JOB_EVENTS)})
    job, _ = _encode(events.column("job"))
    worker, workers = _encode(events.column("worker"))
    stage, _ = _encode(events.column("stage"), {s: i for i, s in enumerate(STAGES)})
    queues = {"init": INIT_QUEUE, "eval": EVAL_QUEUE, "run": RUN_QUEUE}
    to_codes, to_values = _encode(events.column("to"))
    to_map = np.array([queues.get(v.split("@")[0], INIT_QUEUE if v else -1) for v in to_values] or [-1], np.int64)
    return JobEvents(
        t=events.column("t").to_numpy(zero_copy_only=False).astype(float), name=name, job=job, worker=worker,
        workers=np.array(workers, dtype=object), stage=stage, to=to_map[to_codes],
        has_status=np.asarray(pc.is_valid(events.column("status")).to_numpy(zero_copy_only=False), dtype=bool),
    )


def stage_intervals(events: JobEvents, end_of_run: float) -> Intervals:
    """Pair each `<stage>_started` with its `<stage>_finished` (or `returned`) of the same worker and job."""
    starts_by_name = {JOB_EVENTS.index(f"{s}_started"): i for i, s in enumerate(STAGES)}
    ends_by_name = {JOB_EVENTS.index(f"{s}_finished"): i for i, s in enumerate(STAGES)}
    stage = np.full(len(events), -1)
    is_start = np.zeros(len(events), bool)
    for code, index in starts_by_name.items():
        hit = events.name == code
        stage[hit], is_start[hit] = index, True
    for code, index in ends_by_name.items():
        stage[events.name == code] = index
    returned = events.name == JOB_EVENTS.index("returned")
    stage[returned] = events.stage[returned]
    keep = np.flatnonzero(stage >= 0)
    if not len(keep):
        return Intervals(np.array([], dtype=object), np.zeros(0, int), np.zeros(0), np.zeros(0), np.zeros(0, bool))
    stage, start, t = stage[keep], is_start[keep], events.t[keep]
    worker = events.worker[keep]
    key = (events.job[keep] * max(len(events.workers), 1) + worker) * len(STAGES) + stage
    order = np.lexsort((~start, t, key))  # per key by time; a start sorts before an end at the same time
    key, t, start, stage, worker = key[order], t[order], start[order], stage[order], worker[order]
    starts = np.flatnonzero(start)
    following = starts + 1
    has_next = following < len(key)
    closed = np.zeros(len(starts), bool)
    closed[has_next] = (key[following[has_next]] == key[starts[has_next]]) & ~start[following[has_next]]
    ends = np.where(closed, t[np.minimum(following, len(t) - 1)], end_of_run)
    intervals = Intervals(events.workers[worker[starts]], stage[starts], t[starts], np.maximum(ends, t[starts]), ~closed)
    return assign_slots(intervals)


def slots_needed(group: np.ndarray, start: np.ndarray, end: np.ndarray, groups: int) -> np.ndarray:
    """Most intervals running at once, per group: the slots a greedy layout uses."""
    codes = np.concatenate([group, group])
    times = np.concatenate([start, end])
    delta = np.concatenate([np.ones(len(start), int), -np.ones(len(end), int)])
    order = np.lexsort((delta, times, codes))   # an end frees its slot before a start at the same time
    running = np.cumsum(delta[order])          # each group returns to 0 before the next begins
    needed = np.zeros(groups, int)
    np.maximum.at(needed, codes[order], running)
    return needed


def assign_slots(intervals: Intervals, lane_limit: int = LANES_LAID_OUT) -> Intervals:
    """Greedy slot layout per worker and stage, done for the first `lane_limit` slots only (the
    rest are counted, not placed: a timeline shows that many, and the loop is per interval)."""
    names, worker_code = np.unique(intervals.worker.astype(str), return_inverse=True)
    group = worker_code * len(STAGES) + intervals.stage
    needed = slots_needed(group, intervals.start, intervals.end, len(names) * len(STAGES))
    first_lane = np.concatenate([[0], np.cumsum(needed)[:-1]])
    laid_out = first_lane < lane_limit
    lanes = tuple((str(names[g // len(STAGES)]), int(g % len(STAGES)), k)
                  for g in np.flatnonzero(needed) for k in range(needed[g]))
    chosen = np.flatnonzero(laid_out[group])
    order = chosen[np.lexsort((intervals.start[chosen], group[chosen]))].tolist()
    starts, ends, groups = intervals.start.tolist(), intervals.end.tolist(), group.tolist()
    slots = [-1] * len(starts)
    free: list[int] = []
    busy: list[tuple[float, int]] = []
    current, used = -1, 0
    for index in order:
        if groups[index] != current:
            current, free, busy, used = groups[index], [], [], 0
        start = starts[index]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        slot = heapq.heappop(free) if free else used
        if slot == used:
            used += 1
        heapq.heappush(busy, (ends[index], slot))
        slots[index] = slot
    return Intervals(intervals.worker, intervals.stage, intervals.start, intervals.end, intervals.open,
                     np.array(slots, int), lanes)


def occupancy(events: JobEvents, submissions: list[tuple[float, int]]) -> Occupancy:
    """Jobs in each place over time: +1 where an event puts a job, -1 where it was before."""
    place = np.full(len(events), NO_CHANGE)
    code = {name: index for index, name in enumerate(JOB_EVENTS)}
    for name, where in (("init_started", IN_INIT), ("run_started", IN_RUN), ("eval_started", IN_EVAL),
                        ("eval_finished", DONE), ("finished", DONE)):
        place[events.name == code[name]] = where
    for name, next_queue in (("init_finished", RUN_QUEUE), ("run_finished", EVAL_QUEUE)):
        hit = events.name == code[name]
        # A stage that ended the job (failed, cancelled) leaves its row to be written: the eval side.
        place[hit] = np.where(events.has_status[hit], EVAL_QUEUE, next_queue)
    moved = (events.name == code["returned"]) | (events.name == code["requeued"])
    place[moved] = np.where(events.to[moved] >= 0, events.to[moved], INIT_QUEUE)
    keep = place != NO_CHANGE
    t, place, job = events.t[keep], place[keep], events.job[keep]
    order = np.lexsort((t, job))
    t, place, job = t[order], place[order], job[order]
    previous = np.empty_like(place)
    if len(place):
        previous[1:] = place[:-1]
        first_of_job = np.ones(len(job), bool)
        first_of_job[1:] = job[1:] != job[:-1]
        previous[first_of_job] = INIT_QUEUE
    submitted_t = np.array([s for s, _ in submissions], float)
    submitted_n = np.array([n for _, n in submissions], float)
    times = np.concatenate([t, t, submitted_t])
    place_of_change = np.concatenate([previous, place, np.full(len(submitted_t), INIT_QUEUE)])
    delta = np.concatenate([-np.ones(len(t)), np.ones(len(t)), submitted_n])
    per_time, per_count = [], []
    for index in range(len(PLACES)):
        mine = place_of_change == index
        order = np.argsort(times[mine], kind="stable")
        counts = np.cumsum(delta[mine][order])
        if index == INIT_QUEUE and not len(submitted_t) and len(counts):
            counts -= min(0.0, counts.min())
        per_time.append(times[mine][order])
        per_count.append(np.clip(counts, 0, None))
    return Occupancy(tuple(per_time), tuple(per_count), unknown_start=not len(submitted_t))


def rate(times: np.ndarray, weights: np.ndarray | None, edges: np.ndarray) -> np.ndarray:
    """Per-second rate in each bin between `edges` (events, or weights such as tokens)."""
    counts, _ = np.histogram(times, bins=edges, weights=weights)
    return counts / np.diff(edges)

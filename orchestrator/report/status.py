"""What is where, who is alive, how fast: the numbers behind `hpc-rollout status`.

Only numbers here; orchestrator/cli/status.py draws them (once, or live with --watch).
Numbers about finished jobs come from orchestrator.report.finished, shared with `report`.
Reading every shard grows with the run (1e5 shards is routine), so by default they come from
a random sample of STATUS_SAMPLE_SHARDS shards, counts scaled to the number of shards listed;
`exact=True` (`status --exact`) reads them all. Small runs fit in the sample: exact anyway.
pyarrow and numpy load only to read shards: a run with none yet (its first `status`) needs neither.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.batches import count_jobs
from orchestrator.config import RunConfig
from orchestrator.spool.events import recent_events
from orchestrator.spool.liveness import read_workers
from orchestrator.spool.paths import SpoolPaths
from orchestrator.report.backend_health import BackendHealth, backend_health
from orchestrator.report.finished_values import DEFAULT_PASS_REWARD, FINISHED_COLUMNS, FinishedStats
from orchestrator.report.spool_damage import missing_parts
from orchestrator.spool.shardlog import shard_files   # the listing shard_reader exports, without pyarrow

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa

THROUGHPUT_WINDOW_S = 60.0
STATUS_SAMPLE_SHARDS = 100
LATEST_SUBMISSIONS = 3   # their job ranges are shown (where `inspect` and `cancel` send people for ids)


@dataclass
class RunStatus:
    queued: dict[str, int] = field(default_factory=dict)       # queue name -> tickets
    claimed: dict[str, int] = field(default_factory=dict)      # worker -> tickets claimed
    finished: dict[str, int] = field(default_factory=dict)     # status -> rows
    failure_reasons: dict[str, int] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)
    shards: int = 0
    shards_read: int = 0
    exact: bool = True                     # finished figures from every shard (else a sample, scaled)
    finished_last_minute: int = 0
    quarantined: int = 0
    warnings: list[str] = field(default_factory=list)
    results: FinishedStats | None = None   # reward, pass rate, tokens, latency, failures by kind
    tokens_last_minute: int = 0            # sampled tokens of rows finished in the last minute
    backends: BackendHealth = field(default_factory=BackendHealth)   # the LLM backends, and any outage
    submissions: int = 0                                              # submit calls recorded so far
    latest_submissions: list[dict[str, Any]] = field(default_factory=list)   # newest last: id, jobs, job range

    @property
    def pending(self) -> int:
        """Jobs not finished yet (queued or claimed, including rows not yet committed)."""
        return sum(self.queued.values()) + sum(self.claimed.values())

    @property
    def jobs_per_s(self) -> float:
        return self.finished_last_minute / THROUGHPUT_WINDOW_S

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_last_minute / THROUGHPUT_WINDOW_S

    def to_json(self) -> dict[str, Any]:
        return {
            "queued": self.queued, "claimed": self.claimed, "pending": self.pending,
            "finished": self.finished, "failure_reasons": self.failure_reasons,
            "workers": self.workers, "shards": self.shards, "shards_read": self.shards_read,
            "finished_exact": self.exact, "jobs_per_s_last_minute": round(self.jobs_per_s, 3),
            "tokens_per_s_last_minute": round(self.tokens_per_s, 3),
            "quarantined": self.quarantined, "warnings": self.warnings,
            "results": self.results.to_json() if self.results is not None else None,
            "backends": self.backends.to_json(),
            "submissions": self.submissions, "latest_submissions": self.latest_submissions,
        }


def pending_count(paths: SpoolPaths) -> int:
    """Cheap count of unfinished jobs: queued plus claimed tickets (for progress bars).

    Jobs, not files: a batch counts its jobs from its name (orchestrator/spool/batches.py). A claimed
    batch counts all its jobs until its last is resolved; a job of it that went on as a
    ticket of its own is then counted twice for that while.
    """
    total = count_jobs(fsops.list_names(paths.init_queue)) + len(fsops.list_names(paths.eval_queue))
    total += sum(len(fsops.list_names(q)) for q in paths.run_queues())
    for claims in _claim_dirs(paths):
        total += count_jobs(fsops.list_names(claims))
    return total


def _claim_dirs(paths: SpoolPaths) -> list[Any]:
    if not paths.active.is_dir():
        return []
    return [p for p in paths.active.iterdir() if p.is_dir()]


def snapshot(paths: SpoolPaths, config: RunConfig, with_rows: bool = True,
             pass_reward: float = DEFAULT_PASS_REWARD, exact: bool = False,
             sample_shards: int = STATUS_SAMPLE_SHARDS,
             scheduler_warnings: Callable[[list[dict[str, Any]]], list[str]] | None = None) -> RunStatus:
    """The run's figures; finished-job figures from at most `sample_shards` shards unless `exact`.

    `scheduler_warnings(workers)`: what the batch scheduler says of these workers (the callers
    above this layer pass `slurm.queries.slurm_warnings`); its failure becomes a warning too.
    """
    snap = RunStatus()
    snap.queued["init"] = count_jobs(fsops.list_names(paths.init_queue))   # jobs, batches counted by name
    for queue in paths.run_queues():
        snap.queued[queue.name] = len(fsops.list_names(queue))
    snap.queued["eval"] = len(fsops.list_names(paths.eval_queue))
    for claims in _claim_dirs(paths):
        count = count_jobs(fsops.list_names(claims))
        if count:
            snap.claimed[claims.name] = count
    for record in read_workers(paths, config.leases.lease_s):
        info = record.info
        snap.workers.append({
            "worker_id": record.worker_id, "alive": record.alive, "age_s": round(record.age_s, 1),
            "host": info.get("host"), "node": info.get("node"), "pid": info.get("pid"),
            "state": info.get("state"), "pools": info.get("pools", {}), "counters": info.get("counters", {}),
            "buffered_rows": info.get("buffered_rows", 0), "warm_up_s": info.get("warm_up_s"),
            "clock_skew_s": None if record.skew_s is None else round(record.skew_s, 1),
            **{k: v for k, v in info.items() if k.startswith("slurm_")},
        })
        if record.skewed and record.alive:
            snap.warnings.append(_skew_warning(record.worker_id, info.get("node"), record.skew_s or 0.0))
    if with_rows:
        files = shard_files(paths)
        if files:
            _read_finished(snap, paths, files, pass_reward, exact, sample_shards)
        else:   # what finished_stats says of no rows, without loading pyarrow for them
            snap.results = FinishedStats.of_no_rows(pass_reward)
            snap.finished = snap.results.by_status
    else:
        files = shard_files(paths)
        snap.shards = len(files)
    snap.warnings += missing_parts(paths, [f.name for f in files])
    since = time.time() - THROUGHPUT_WINDOW_S
    snap.finished_last_minute = sum(1 for _ in recent_events(paths, since, {"finished"}))
    snap.backends = backend_health(paths, config)
    snap.submissions, snap.latest_submissions = _latest_submissions(paths)
    snap.quarantined = len([n for n in fsops.list_names(paths.quarantine) if not n.endswith(".reason")])
    if snap.quarantined:
        snap.warnings.append(f"{snap.quarantined} corrupt file(s) quarantined in {paths.quarantine}")
    if scheduler_warnings is not None:
        snap.warnings += _asked(scheduler_warnings, snap.workers)
    return snap


def _read_finished(snap: RunStatus, paths: SpoolPaths, files: list[Path], pass_reward: float, exact: bool,
                   sample_shards: int) -> None:
    """The finished-job figures of `snap`, from every shard or a sample of them."""
    import numpy as np

    from orchestrator.report.finished import finished_stats, seconds
    from orchestrator.report.shard_read import read_shards

    chosen = files if exact or len(files) <= sample_shards else random.sample(files, sample_shards)
    shards = read_shards(paths, FINISHED_COLUMNS, files=chosen)
    snap.shards, snap.shards_read, snap.exact = len(files), shards.shards_read, len(chosen) == len(files)
    scale = len(files) / len(chosen) if chosen else 1.0
    snap.warnings += [f"could not read {item}" for item in shards.skipped]
    rows = shards.rows
    snap.results = _scaled_stats(finished_stats(rows, pass_reward), scale)
    snap.finished = snap.results.by_status
    snap.failure_reasons = _scaled(_failure_reasons(rows), scale)
    recent = seconds(rows.column("finished_at")) >= time.time() - THROUGHPUT_WINDOW_S
    tokens = rows.column("sampled_tokens").to_numpy(zero_copy_only=False)
    snap.tokens_last_minute = round(scale * np.nansum(np.asarray(tokens, dtype=float)[recent])) if recent.any() else 0


def _skew_warning(worker_id: str, node: Any, skew_s: float) -> str:
    how = "ahead of" if skew_s > 0 else "behind"
    return (f"clock skew: worker {worker_id} (node {node}) runs {abs(skew_s):.1f} s {how} the filesystem's clock "
            f"(its heartbeat's own time vs the file's mtime); liveness does not depend on it, but the times it "
            f"writes (events, rows) are off by as much: check NTP on that node")


def _latest_submissions(paths: SpoolPaths) -> tuple[int, list[dict[str, Any]]]:
    """How many submissions there were, and the newest few (their names sort by submission time)."""
    names = sorted(n for n in fsops.list_names(paths.submissions) if n.endswith(".json"))
    latest = []
    for name in names[-LATEST_SUBMISSIONS:]:
        try:
            record = orjson.loads(fsops.read_bytes(paths.submissions / name))
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(record, dict):
            latest.append({key: record.get(key) for key in ("submission_id", "jobs", "first_job", "last_job")}
                          | {"rejected": len(record.get("rejected") or [])})
    return len(names), latest


def _scaled(counts: dict[str, int], scale: float) -> dict[str, int]:
    """Counts of a sample of the shards, estimated for all of them."""
    return {key: round(count * scale) for key, count in counts.items()}


def _scaled_stats(stats: FinishedStats, scale: float) -> FinishedStats:
    """Totals of a sample of the shards (jobs, tokens, counts by status and by failure), estimated
    for all of them; means, rates and percentiles stand as measured on the sample."""
    if scale == 1.0:
        return stats
    failures = tuple(replace(group, count=round(group.count * scale)) for group in stats.failures)
    return replace(stats, jobs=round(stats.jobs * scale), tokens=round(stats.tokens * scale),
                   rewarded=round(stats.rewarded * scale),
                   by_status=_scaled(stats.by_status, scale), failures=failures)


def _failure_reasons(rows: pa.Table) -> dict[str, int]:
    """The ten most frequent error texts: the first line of failures, the kind of timeouts and cancels."""
    import pyarrow.compute as pc

    reasons: Counter[str] = Counter()
    failed = rows.filter(pc.is_valid(rows.column("error")))
    for status, error in zip(failed.column("status").to_pylist(), failed.column("error").to_pylist()):
        reasons[error.split(":", 1)[0] if status != "failed" else _reason(error)] += 1
    return dict(reasons.most_common(10))


def _reason(error: str) -> str:
    head = error.splitlines()[0] if error else ""
    return head[:120]


def _asked(scheduler_warnings: Callable[[list[dict[str, Any]]], list[str]], workers: list[dict[str, Any]]) -> list[str]:
    try:
        return list(scheduler_warnings(workers))
    except Exception as exc:  # squeue/sacct trouble must not break status
        return [f"could not ask the scheduler about the workers: {exc}"]

"""Every path inside a run directory (the spool), in one place.

The layout is the interface researchers see with `ls`; keep it obvious:

    run.toml                    pools, timeouts, retries, shard rolling
    backends.json               LLM backend registry (+ backends.json.lock)
    backends/inflight/W.json    tasks in flight per backend, one file per worker
    backends/history.jsonl      every registry change (added, removed, down/up, new version)
    queue/init/TICKET           pending jobs, names sort in submission order
    queue/init/JOB+N            a batch: N consecutive jobs from JOB in one file (orchestrator/spool/batches.py)
    queue/run@NODE/TICKET       jobs prepared by INIT on NODE, waiting for RUN there
    queue/eval/TICKET           jobs whose RUN is over, any node may evaluate them
    active/W/TICKET             tickets claimed by worker W (its lease is workers/W.json)
    active/W/.handoffs          jobs of W's claimed batches that left as tickets of their own
    workers/W.json              heartbeat: host, node, pid, Slurm ids, pools, counters
    workers/fenced/W            W lost its lease while alive (its lost attempts are not charged)
    events/W.jsonl              every job event worker W produced (one open file per worker)
    jobs/XX/JOB/                per-job artifacts and logs, created only when a handler needs it
    submissions/S.json          what one `submit` accepted and rejected
    shards/*.parquet            committed trajectory rows (written as _tmp-*, then renamed)
    cancel/JOB | group-G | ALL  cancellation requests
    control/stop                ask every worker of the run to drain and exit
    control/cluster.json        runs of > 16 workers: the cluster summary every worker reads (+ .lock)
    quarantine/                 corrupt files, moved aside (never deleted)
    logs/LAUNCH/                worker logs of one launch; logs/latest points at the newest
    tmp/                        half-written files on their way to a rename
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.spool import fsops

# Ticket, worker and node names become file names: keep them to a safe alphabet.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")


def safe_name(value: str, what: str) -> str:
    """Return `value` if it can be used as a file name in the spool, else raise ValueError."""
    if not SAFE_NAME.match(value):
        raise ValueError(
            f"{what} {value!r} cannot be used as a file name: use letters, digits and . _ @ + -"
        )
    return value


def current_node() -> str:
    """The node this process runs on: Slurm's node name when inside a job, else the host name.

    Emulated Slurm nodes share one host name, so SLURMD_NODENAME comes first.
    """
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


@dataclass(frozen=True)
class SpoolPaths:
    root: Path

    @classmethod
    def of(cls, root: str | os.PathLike[str]) -> "SpoolPaths":
        return cls(Path(root).absolute())

    # -- configuration -------------------------------------------------------------
    @property
    def run_config(self) -> Path:
        return self.root / "run.toml"

    @property
    def backends(self) -> Path:
        return self.root / "backends.json"

    @property
    def backends_lock(self) -> Path:
        return self.root / "backends.json.lock"

    @property
    def backends_inflight(self) -> Path:
        return self.root / "backends" / "inflight"

    @property
    def backends_history(self) -> Path:
        return self.root / "backends" / "history.jsonl"

    # -- queues ----------------------------------------------------------------------
    @property
    def queue(self) -> Path:
        return self.root / "queue"

    @property
    def init_queue(self) -> Path:
        return self.queue / "init"

    @property
    def eval_queue(self) -> Path:
        return self.queue / "eval"

    def run_queue(self, node: str) -> Path:
        return self.queue / f"run@{safe_name(node, 'node name')}"

    def run_queues(self) -> list[Path]:
        return sorted(self.queue / name for name in fsops.list_names(self.queue) if name.startswith("run@"))

    @property
    def active(self) -> Path:
        return self.root / "active"

    def claims(self, worker_id: str) -> Path:
        return self.active / worker_id

    # -- workers and events ------------------------------------------------------------
    @property
    def workers(self) -> Path:
        return self.root / "workers"

    def heartbeat(self, worker_id: str) -> Path:
        return self.workers / f"{worker_id}.json"

    def fence_mark(self, worker_id: str) -> Path:
        """Exists when worker W found its claims taken over while it was alive (fenced)."""
        return self.workers / "fenced" / worker_id

    @property
    def events(self) -> Path:
        return self.root / "events"

    def worker_events(self, worker_id: str) -> Path:
        return self.events / f"{worker_id}.jsonl"

    # -- jobs ------------------------------------------------------------------------------
    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def job_dir(self, job_id: str) -> Path:
        # Two-level fan-out keeps directories small on Lustre/GPFS.
        return self.jobs / job_id[-2:] / job_id

    def make_job_dir(self, job_id: str) -> Path:
        """job_dir(job_id), made a real directory of the run (a planted link is moved aside)."""
        return fsops.ensure_real_dirs(self.jobs, (job_id[-2:], job_id), self.quarantine)

    @property
    def submissions(self) -> Path:
        return self.root / "submissions"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    @property
    def cancel(self) -> Path:
        return self.root / "cancel"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def stop_request(self) -> Path:
        return self.control / "stop"

    @property
    def cluster_summary(self) -> Path:
        return self.control / "cluster.json"

    @property
    def quarantine(self) -> Path:
        return self.root / "quarantine"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def directories(self) -> list[Path]:
        """Directories `init` creates (run queues appear per node when first used)."""
        return [
            self.init_queue, self.eval_queue, self.active, self.workers, self.events,
            self.jobs, self.submissions, self.shards, self.cancel, self.control,
            self.quarantine, self.logs, self.tmp, self.backends_inflight,
        ]

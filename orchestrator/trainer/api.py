"""The Python API for trainers: submit, cancel, read finished trajectories with a cursor.

    from orchestrator.trainer.api import Spool
    spool = Spool.create("spool/run1")
    spool.submit([{"messages": [...], "user_turns": [...]}], handler="chat", samples=8)
    reader = spool.reader()                       # resumable: str(reader.cursor) survives restarts
    for group in reader.groups(follow=True):      # only complete groups (all samples finished)
        train_on(group)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from orchestrator.spool.cancel import request_cancel
from orchestrator.config import RunConfig
from orchestrator.spool.paths import SpoolPaths
from orchestrator.trainer.cursor import Cursor
from orchestrator.spool.rundir import init_run, open_run
from orchestrator.report.status import RunStatus, snapshot
from orchestrator.slurm.queries import slurm_warnings
from orchestrator.submission.submit import SubmitReport, submit_file, submit_rows
from orchestrator.trainer.tail import RowReader

if TYPE_CHECKING:
    from orchestrator.llm.weights import SwapReport
    from orchestrator.trainer.replay import Replay
    from orchestrator.trainer.replay_filter import Query


@dataclass(frozen=True)
class Spool:
    paths: SpoolPaths
    config: RunConfig

    @classmethod
    def create(cls, root: str | Path, **settings: Any) -> "Spool":
        """Create (or reopen) a run directory; settings as dotted keys, e.g. {"pools.run": 16}."""
        paths, config = init_run(root, settings or None)
        return cls(paths, config)

    @classmethod
    def open(cls, root: str | Path) -> "Spool":
        paths, config = open_run(root)
        return cls(paths, config)

    def submit(self, tasks: Iterable[dict[str, Any]], handler: str | None = None, samples: int = 1,
               sampling: dict[str, Any] | None = None, strict: bool = False,
               sampling_unchecked: bool = False, source_handlers: dict[str, str] | None = None,
               batch_size: int | None = None, staleness: str | None = None,
               resource_class: str | None = None) -> SubmitReport:
        """Queue tasks (row shapes as for `hpc-rollout submit`); bad rows are in the report.

        `source_handlers` maps verl data_source values to handlers, e.g. {"openai/gsm8k": "answer"};
        `batch_size` jobs share a queue entry (default run.toml's jobs.batch_size); `staleness`
        ("restart" | "continue", default run.toml's [trainer] staleness): what a job whose policy
        fell behind the bound does (docs/trainer.md, "Partial rollouts"); `resource_class` names a
        class of run.toml [classes] for these jobs (docs/scale.md, "Resource classes").
        """
        return submit_rows(self.paths, enumerate(tasks, 1), "<api>", handler, samples, sampling, strict,
                           sampling_unchecked, source_handlers, batch_size, staleness,
                           resource_class=resource_class)

    def submit_file(self, path: str | Path, **options: Any) -> SubmitReport:
        return submit_file(self.paths, Path(path), **options)

    def cancel(self, job_ids: Iterable[str] = (), groups: Iterable[str] = (), everything: bool = False) -> list[str]:
        return request_cancel(self.paths, tuple(job_ids), tuple(groups), everything)

    def reader(self, cursor: Cursor | str | None = None, columns: Sequence[str] | None = None,
               poll_s: float = 0.2) -> RowReader:
        """Finished rows from `cursor` on (None: from the start); `columns` None reads them all."""
        return RowReader(self.paths, cursor, poll_s=poll_s, columns=columns)

    def query(self, query: "Query | None" = None, columns: Sequence[str] | None = None,
              complete: bool = False, **fields: Any) -> "Replay":
        """Whole groups of the finished rows a query selects, ready for the batchers (replay).

        `query` or its fields as keywords: spool.query(reward_min=0.5, handlers=["math"]);
        `columns` None: the trainer's columns (tail.py TRAINER_COLUMNS); `complete` leaves out
        groups with fewer rows than group_size. See orchestrator/trainer/replay.py.
        """
        from orchestrator.trainer.replay import query_groups
        from orchestrator.trainer.replay_filter import Query
        from orchestrator.trainer.tail import TRAINER_COLUMNS

        return query_groups(self.paths, query or Query(**fields), columns or TRAINER_COLUMNS, complete)

    def swap_weights(self, checkpoint: str | Path, version: int, max_policy_lag: int | None = None,
                     abort: bool | None = None, rolling: bool = False,
                     min_serving: float | None = None) -> "SwapReport":
        """Every registered backend loads `checkpoint` while serving; then the policy version moves.

        `max_policy_lag` (default: run.toml [trainer] max_policy_lag) marks samples older than
        version - lag as stale: restart jobs that took them are cancelled, the sampler skips their
        rows (continue jobs go on; their stale turns are masked). `abort` (default: run.toml
        [trainer] staleness is continue) first aborts generations in flight; they resume on the
        new weights as the next request of their turn. `rolling` reloads the backends in waves,
        keeping at least `min_serving` of them (default 0.5, at least one) serving; it needs
        max_policy_lag >= 1 (the backends waiting for their wave serve the previous version) and
        raises RollingRefused otherwise (docs/scale.md, "Rolling weight updates").
        """
        from orchestrator.config import Staleness
        from orchestrator.llm.weights import DEFAULT_MIN_SERVING, swap_weights

        lag = self.config.trainer.max_policy_lag if max_policy_lag is None else max_policy_lag
        if abort is None:
            abort = Staleness.parse(self.config.trainer.staleness) is Staleness.CONTINUE
        share = DEFAULT_MIN_SERVING if min_serving is None else min_serving
        return swap_weights(self.paths, checkpoint, version, lag, abort, rolling, share)

    def status(self, exact: bool = False) -> RunStatus:
        """The run's figures; finished-job figures from a bounded sample of shards unless `exact`."""
        return snapshot(self.paths, self.config, exact=exact, scheduler_warnings=slurm_warnings)

"""A damaged shard in a run: every reader of shards skips it the same way, instead of crashing.

Issue 38: shards were read in eight modules, each catching its own set of errors; `report` let a
ValueError from a damaged shard escape, `status` and the replay query a UnicodeDecodeError (text
that is not UTF-8 decodes lazily, when a row becomes Python values), the row tally a KeyError (a
shard without a column it counts). Every reader now decodes through orchestrator/spool/shard_reader.py.
In-process: the shards are written by a ShardWriter, as a worker writes them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.config import RunConfig
from orchestrator.report.build import make_report
from orchestrator.report.inspect_job import find_row, inspect_job
from orchestrator.report.job_progress import rows_in
from orchestrator.report.model import load_report
from orchestrator.report.status import snapshot
from orchestrator.report.tally import RowTally
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rows import rows_to_table
from orchestrator.spool.shard_reader import iter_rows, shard_names
from orchestrator.spool.shardlog import WriterDirectory, shard_name
from orchestrator.spool.shards import ShardWriter, committed_job_ids
from orchestrator.trainer.api import Spool
from orchestrator.trainer.replay import query_groups
from tests.core.util import make_run

GOOD_JOBS = ["ok-1", "ok-2", "failed-1"]


def _row(job_id: str, error: str | None = None) -> dict[str, Any]:
    return {"job_id": job_id, "group_id": job_id, "group_size": 1, "sample_index": 0, "handler": "echo",
            "status": "failed" if error else "ok", "reward": 0.0 if error else 1.0, "attempt": 1,
            "error": error, "error_stage": "run" if error else None}


def _not_utf8(bad: Path) -> None:
    """A failed job's row whose error text is not UTF-8 (bytes flipped on disk, checksums off)."""
    table = rows_to_table([_row("bad-1", "RuntimeError: boom")])
    at = table.schema.get_field_index("error")
    text = pa.array([b"RuntimeError: \xff\xfe"], pa.binary()).view(pa.string())
    pq.write_table(table.set_column(at, table.schema.field(at), text), bad)


DAMAGE: dict[str, Callable[[Path, Path], None]] = {
    "truncated": lambda good, bad: bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2]),
    "not parquet": lambda good, bad: bad.write_bytes(b"not parquet at all\n" * 20),
    "empty": lambda good, bad: bad.write_bytes(b""),
    "not UTF-8": lambda good, bad: _not_utf8(bad),
    "a directory": lambda good, bad: bad.mkdir(),
    "a FIFO": lambda good, bad: os.mkfifo(bad),
}


def _run_with_a_damaged_shard(root: Path, damage: str) -> tuple[SpoolPaths, str]:
    paths = make_run(root / "run")
    writer = ShardWriter(paths, "w1", RunConfig.load(paths.run_config).shards)
    for job in GOOD_JOBS:
        writer.add(_row(job, "ValueError: no answer" if job.startswith("failed") else None), f"ticket-{job}")
    writer.commit()
    writer.close()
    bad = shard_name(WriterDirectory(paths).register("w2"), 1)
    DAMAGE[damage](paths.shards / shard_name("w1", 1), paths.shards / bad)
    return paths, bad


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_every_reader_skips_a_damaged_shard(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    paths, bad = _run_with_a_damaged_shard(tmp_path, damage)
    caplog.set_level(logging.WARNING)
    warned = f"skipping unreadable shard {bad}"

    assert dict(iter_rows(paths))[bad] == [] and warned in caplog.text
    assert sorted(r["job_id"] for _, rows in iter_rows(paths) for r in rows) == sorted(GOOD_JOBS)

    caplog.clear()
    reader = Spool.open(paths.root).reader()
    assert sorted(r["job_id"] for r in reader.rows()) == sorted(GOOD_JOBS)
    assert reader.skipped_shards == [bad] and warned in caplog.text

    # The tally reads status and attempt, the progress count the footers: sound in the shard whose
    # only damage is its error text, which they count like any other; the readers of whole rows skip it.
    counted = 1 if damage == "not UTF-8" else 0
    caplog.clear()
    tally = RowTally(paths)
    tally.refresh()
    assert (tally.done, tally.failed) == (3 + counted, 1 + counted)
    assert (warned in caplog.text) == (not counted)
    assert rows_in(paths, shard_names(paths)) == 3 + counted

    caplog.clear()
    assert find_row(paths, "bad-1") is None and find_row(paths, "ok-1") is not None and warned in caplog.text
    assert inspect_job(paths, "failed-1")["row"]["status"] == "failed"

    replay = query_groups(paths)
    assert sorted(g[0]["job_id"] for g in replay.groups) == sorted(GOOD_JOBS)
    assert [s for s in replay.skipped if bad in s], replay.skipped

    status = snapshot(paths, RunConfig.load(paths.run_config), exact=True)
    assert status.finished.get("ok") == 2 and [w for w in status.warnings if bad in w], status.warnings

    report = load_report(paths)
    assert report.shards_read == 1 and [s for s in report.skipped if bad in s], report.skipped
    made = make_report(paths)
    assert made.page.is_file() and [s for s in made.report.skipped if bad in s]

    # Recovery reads the job ids (sound in the shard with bad error text); a shard it cannot read
    # is moved to quarantine/, never read again.
    assert committed_job_ids(paths, "w2") == ({"bad-1"} if counted else set())
    assert (bad in shard_names(paths)) == bool(counted)


def test_a_shard_without_some_columns_is_read_with_nulls_for_them(tmp_path: Path) -> None:
    # (an older writer's shard, or one written by hand): what the report always did, now every reader
    paths, bad = _run_with_a_damaged_shard(tmp_path, "empty")
    pq.write_table(pa.table({"job_id": ["old-1"], "status": ["ok"]}), paths.shards / bad)
    everyone = sorted([*GOOD_JOBS, "old-1"])

    assert sorted(r["job_id"] for _, rows in iter_rows(paths) for r in rows) == everyone
    assert sorted(r["job_id"] for r in Spool.open(paths.root).reader(columns=["job_id", "attempt"]).rows()) == everyone
    tally = RowTally(paths)
    tally.refresh()
    assert (tally.done, tally.retried) == (4, 0)
    assert rows_in(paths, shard_names(paths)) == 4
    assert find_row(paths, "old-1") == {"job_id": "old-1", "status": "ok"}
    assert sorted(g[0]["job_id"] for g in query_groups(paths).groups) == everyone
    assert snapshot(paths, RunConfig.load(paths.run_config), exact=True).finished.get("ok") == 3
    assert load_report(paths).shards_read == 2
    assert committed_job_ids(paths, "w2") == {"old-1"} and bad in shard_names(paths)

"""A worker SIGKILLed mid-run leaves its shard writer open; recovery closes it at its last shard."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

from orchestrator.spool import fsops
from orchestrator.spool.shardlog import WriterDirectory, last_committed_seq, parse_shard_name, shard_name
from orchestrator.spool.shards import shard_names
from orchestrator.submission.submit import submit_file
from orchestrator.trainer.tail import RowReader
from tests.core.util import make_run, start_worker, stop_worker, wait_drained, wait_until, write_jsonl


def shards_of(paths: object, writer: str) -> list[int]:
    return sorted(seq for w, seq in filter(None, map(parse_shard_name, shard_names(paths))) if w == writer)  # type: ignore[arg-type]


def test_recovery_closes_the_writer_of_a_sigkilled_worker(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"shards.max_rows": 3})
    task = {"handler": "sleep", "instance": {"init": 0.01, "run": {"uniform": [0.05, 0.3]}, "seed": 4}}
    submitted = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [task] * 40))
    directory = WriterDirectory(paths)
    victim = start_worker(paths, "--run-pool", "4")
    steady = None
    try:
        wait_until(lambda: any(shards_of(paths, w) for w in directory.open()), 120, "the victim's first shard")
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        [victim_writer] = directory.open()
        steady = start_worker(paths, "--run-pool", "4")
        wait_drained(paths, timeout=180)
        # The victim's claims are back (drained), so recovery has found it dead: its writer goes too.
        wait_until(lambda: victim_writer not in directory.open(), 60, "recovery to close the dead worker's writer")
        assert directory.closed()[victim_writer] == max(shards_of(paths, victim_writer))
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
        assert steady is None or stop_worker(steady) == 0
    assert directory.open() == [], "a stopped worker's writer stays listed"
    reader = RowReader(paths, columns=["job_id"])
    delivered = Counter(job for batch in reader.batches() for job in batch.column("job_id").to_pylist())
    assert len(delivered) == submitted.jobs and max(delivered.values()) == 1
    assert reader.skipped_shards == []


def test_the_last_shard_is_found_past_a_quarantined_one_in_few_stats(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    assert last_committed_seq(paths, "w", 0) == 0
    for seq in [*range(1, 12), *range(13, 38)]:   # shard 12 was moved to quarantine
        (paths.shards / shard_name("w", seq)).touch()
    before = sum(fsops.OPS.values())
    assert last_committed_seq(paths, "w", 0) == 37
    assert sum(fsops.OPS.values()) - before <= 30   # galloping: O(log n), not one stat per shard
    assert last_committed_seq(paths, "w", 30) == 37
    assert last_committed_seq(paths, "w", 37) == 37
    assert last_committed_seq(paths, "other", 0) == 0

"""Shard rolling and naming; the sleep handler's distributions."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from hpc_rollout.handlers.sleep import draw_seconds
from orchestrator.config import Shards
from orchestrator.spool.jobs import JobSpec, JobStatus
from orchestrator.spool.rows import build_row
from orchestrator.spool.shardlog import WriterDirectory
from orchestrator.spool.shards import ShardWriter, shard_names
from orchestrator.spool.tickets import Ticket
from tests.core.util import make_run


def row(i: int, payload: int = 0) -> dict:
    job = JobSpec(job_id=f"j{i:04d}", group_id="g", instance_id="i", sample_index=i, handler="echo", instance={"pad": "x" * payload})
    return build_row(Ticket(job=job), {"reward": 1.0, "response_ids": list(range(payload))}, JobStatus.OK, "w")


def test_rolls_by_rows_bytes_and_age(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    by_rows = ShardWriter(paths, "w1", Shards(max_rows=3, max_bytes=1 << 30, max_age_s=3600, idle_flush_s=3600))
    for i in range(2):
        by_rows.add(row(i), f"j{i}")
    assert not by_rows.due(idle=True)
    by_rows.add(row(2), "j2")
    assert by_rows.due(idle=False)
    assert by_rows.commit() == ["j0", "j1", "j2"] and by_rows.pending == 0

    by_bytes = ShardWriter(paths, "w2", Shards(max_rows=1000, max_bytes=4096, max_age_s=3600, idle_flush_s=3600))
    by_bytes.add(row(3, payload=2000), "j3")
    assert by_bytes.due(idle=False)

    by_age = ShardWriter(paths, "w3", Shards(max_rows=1000, max_bytes=1 << 30, max_age_s=0.05, idle_flush_s=3600))
    by_age.add(row(4), "j4")
    assert not by_age.due(idle=False)
    time.sleep(0.06)
    assert by_age.due(idle=False)

    idle = ShardWriter(paths, "w4", Shards(max_rows=1000, max_bytes=1 << 30, max_age_s=3600, idle_flush_s=0.05))
    idle.add(row(5), "j5")
    time.sleep(0.06)
    assert idle.due(idle=True) and not idle.due(idle=False)


def test_shards_are_named_by_writer_sequence_and_never_partial(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    writer = ShardWriter(paths, "node1-1-abcd", Shards())
    for batch in range(3):
        writer.add(row(batch), f"j{batch}")
        writer.commit()
    names = shard_names(paths)
    assert names == [f"node1-1-abcd-{seq:08d}.parquet" for seq in (1, 2, 3)]
    assert WriterDirectory(paths).open() == ["node1-1-abcd"]
    writer.close()
    assert WriterDirectory(paths).open() == [] and WriterDirectory(paths).closed() == {"node1-1-abcd": 3}
    again = ShardWriter(paths, "node1-1-abcd", Shards())   # the same worker id after a restart
    again.add(row(3), "j3")
    again.commit()
    assert again.writer == "node1-1-abcd+2" and "node1-1-abcd+2-00000001.parquet" in shard_names(paths)
    (paths.shards / "_tmp-half-written.parquet").write_bytes(b"PAR1 not finished")
    table = ds.dataset(paths.shards, format="parquet").to_table()  # the partial file is invisible
    assert sorted(table.column("job_id").to_pylist()) == ["j0000", "j0001", "j0002", "j0003"]


def test_sleep_durations() -> None:
    rng = lambda: random.Random(5)  # noqa: E731
    assert draw_seconds(0.5, rng()) == 0.5 and draw_seconds(None, rng()) == 0.0
    uniform = [draw_seconds({"uniform": [1, 3]}, rng()) for _ in range(3)]
    assert len(set(uniform)) == 1 and 1 <= uniform[0] <= 3  # same seed, same draw
    spec = {"lognormal": {"mean": 3, "sigma": 0.5}, "tail_p": 0.1, "tail_factor": 10}
    draws = [draw_seconds(spec, random.Random(i)) for i in range(4000)]
    tail = sum(d > 12 for d in draws) / len(draws)
    assert 0.06 < tail < 0.14                                   # ~10% ten times longer
    body = sorted(draws)[: int(0.85 * len(draws))]
    assert 2.0 < sum(body) / len(body) < 3.2
    with pytest.raises(ValueError, match="exactly one of"):
        draw_seconds({"uniform": [0, 1], "exponential": 1}, rng())
    with pytest.raises(ValueError, match="negative"):
        draw_seconds(-1, rng())

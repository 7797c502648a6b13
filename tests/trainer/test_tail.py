"""The tail: every row exactly once, in an order no clock decides, from a cursor that survives crashes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.spool import fsops
from orchestrator.config import Shards
from orchestrator.trainer.cursor import Cursor, CursorError
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shardlog import shard_name
from orchestrator.spool.shards import ShardWriter
from orchestrator.trainer.tail import RowReader
from tests.core.util import make_run


def group_rows(group: str, size: int) -> list[dict[str, Any]]:
    return [{"job_id": f"{group}-{i:04d}", "group_id": group, "group_size": size, "sample_index": i,
             "status": "ok", "reward": float(i)} for i in range(size)]


def commit(writer: ShardWriter, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        writer.add(row, row["job_id"])
    writer.commit()


def test_a_shard_landing_late_under_an_earlier_clock_is_delivered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported loss: node B commits, the reader reads, then node A (clock 1 s behind) commits."""
    paths = make_run(tmp_path / "run")
    node_a, node_b = ShardWriter(paths, "nodeA-1-aa", Shards()), ShardWriter(paths, "nodeB-1-bb", Shards())
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 60)      # B's clock is ahead
    commit(node_b, group_rows("gb", 2))
    reader = RowReader(paths)
    assert [r["job_id"] for r in reader.rows()] == ["gb-0000", "gb-0001"]
    monkeypatch.setattr(time, "time", lambda: real() - 60)      # A's is behind
    commit(node_a, group_rows("ga", 2))
    assert [r["job_id"] for r in reader.rows()] == ["ga-0000", "ga-0001"]
    assert [r["job_id"] for r in RowReader(paths, reader.cursor).rows()] == []


def test_a_cursor_taken_mid_shard_resumes_without_repeating(tmp_path: Path) -> None:
    """The reported duplicate: 2 of 3 groups of one shard taken, cursor saved, reader restarted."""
    paths = make_run(tmp_path / "run")
    writer = ShardWriter(paths, "w1", Shards())
    commit(writer, group_rows("g1", 2) + group_rows("g2", 2) + group_rows("g3", 2))
    reader = RowReader(paths)
    groups = reader.groups()
    taken = [next(groups)[0]["group_id"], next(groups)[0]["group_id"]]
    saved = str(reader.cursor)
    assert json.loads(saved)["held"] == {"w1": {"1": [[4, 6]]}}    # the third group is still held
    resumed = [g[0]["group_id"] for g in RowReader(paths, saved).groups()]
    assert taken == ["g1", "g2"] and resumed == ["g3"]


def test_half_a_group_before_the_cursor_comes_back_after_a_restart(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    first, second = ShardWriter(paths, "w1", Shards()), ShardWriter(paths, "w2", Shards())
    rows = group_rows("g", 4)
    commit(first, rows[:3] + group_rows("h", 1))
    reader = RowReader(paths)
    assert [g[0]["group_id"] for g in reader.groups()] == ["h"]       # g waits for its 4th sample
    saved = str(reader.cursor)
    commit(second, rows[3:])
    group = next(RowReader(paths, saved).groups())
    assert [r["job_id"] for r in group] == [r["job_id"] for r in rows]


def test_missing_and_unreadable_shards_are_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = make_run(tmp_path / "run")
    writer = ShardWriter(paths, "w1", Shards())
    for name in ("a", "b", "c", "d"):
        commit(writer, group_rows(name, 1))
    os.rename(paths.shards / shard_name("w1", 2), paths.quarantine / shard_name("w1", 2))   # moved aside
    (paths.shards / shard_name("w1", 3)).write_bytes(b"PAR1 garbage")                       # corrupt
    reader = RowReader(paths)
    assert [r["group_id"] for r in reader.rows()] == ["a", "d"]
    assert reader.skipped_shards == [shard_name("w1", 2), shard_name("w1", 3)]
    assert "quarantined" in caplog.text and "unreadable" in caplog.text


def test_a_writer_that_opens_and_closes_between_two_polls_is_read(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    reader = RowReader(paths)
    assert list(reader.rows()) == []
    brief = ShardWriter(paths, "brief", Shards())
    commit(brief, group_rows("x", 2))
    brief.close()
    assert [r["job_id"] for r in reader.rows()] == ["x-0000", "x-0001"]
    assert list(RowReader(paths, reader.cursor).rows()) == []


def test_a_poll_costs_the_same_with_100_shards_per_writer_as_with_one(tmp_path: Path) -> None:
    def ops_per_poll(shards_per_writer: int) -> int:
        paths = make_run(tmp_path / f"run{shards_per_writer}")
        for w in range(3):
            writer = ShardWriter(paths, f"w{w}", Shards())
            for s in range(shards_per_writer):
                commit(writer, group_rows(f"g{w}-{s}", 1))
        reader = RowReader(paths)
        assert len(list(reader.rows())) == 3 * shards_per_writer
        before = sum(fsops.OPS.values())
        reader.poll()
        return sum(fsops.OPS.values()) - before

    # 3 writers: a listing of the open writers, a stat of closed/, the shards directory opened
    # (fsops.refresh_dir: shards other nodes committed are found by name at once on NFS), the probes
    assert ops_per_poll(100) == ops_per_poll(1) <= 9


def test_bad_cursors_are_refused_with_the_fix() -> None:
    with pytest.raises(CursorError, match="not JSON"):
        Cursor.parse("20240101-node-1.parquet")
    with pytest.raises(CursorError, match="malformed"):
        Cursor.parse('{"v": 1, "next": {"w": 0}}')
    assert Cursor.parse(str(Cursor.of({"w": 3}, [("w", 2, 0), ("w", 2, 1), ("w", 2, 5)]))).held == {"w": {2: ((0, 2), (5, 6))}}


@pytest.mark.parametrize("mode", ["groups", "rows", "batches"])
def test_eight_skewed_writers_and_a_reader_killed_at_random_deliver_every_row_once(tmp_path: Path, mode: str) -> None:
    rng = random.Random({"groups": 7, "rows": 8, "batches": 9}[mode])
    paths = make_run(tmp_path / "run")
    all_rows = [row for g in range(120) for row in group_rows(f"g{g:03d}", rng.choice([1, 3, 4, 8]))]
    rng.shuffle(all_rows)   # the samples of a group land on different writers, in any order
    writers = []
    for index in range(8):
        plan = tmp_path / f"plan{index}.json"
        plan.write_text(json.dumps(all_rows[index::8]))
        skew = rng.uniform(-60, 60)
        writers.append(subprocess.Popen([sys.executable, "-m", "tests.trainer.tail_writer", str(paths.root),
                                         f"node{index}-{index}-{index:04x}", f"{skew:.3f}", str(plan), str(index)]))
    state = tmp_path / "state"
    state.mkdir()
    kills = 0
    try:
        while any(w.poll() is None for w in writers) or kills < 6:
            consumer = start_consumer(paths, state, mode, seed=kills)
            time.sleep(rng.uniform(0.3, 1.2))
            if consumer.poll() is None:
                consumer.send_signal(signal.SIGKILL)
                kills += 1
            consumer.wait()
        assert all(w.wait() == 0 for w in writers)
        (tmp_path / "writers-done").touch()
        for attempt in range(200):   # the last runs go to the end (a few still die on purpose)
            if start_consumer(paths, state, mode, seed=1000 + attempt).wait(timeout=120) == 0:
                break
    finally:
        for process in writers:
            if process.poll() is None:
                process.kill()
    delivered = [job for f in sorted(state.glob("*.json")) for job in json.loads(f.read_text())["jobs"]]
    assert len(delivered) == len(set(delivered)), "a row was delivered twice"
    assert sorted(delivered) == sorted(r["job_id"] for r in all_rows), "a row was lost"
    cursors = [json.loads(json.loads(f.read_text())["cursor"]) for f in state.glob("*.json")]
    assert any("held" in c for c in cursors), "no cursor was ever taken mid-shard or mid-group"
    assert kills >= 6


def start_consumer(paths: SpoolPaths, state: Path, mode: str, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.trainer.tail_consumer", str(paths.root), str(state), mode, str(seed)])


def test_batches_move_the_cursor_by_exactly_the_rows_handed_out(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    first, second = ShardWriter(paths, "w1", Shards()), ShardWriter(paths, "w2", Shards())
    commit(first, group_rows("a", 3))
    commit(second, group_rows("b", 2))
    commit(first, group_rows("c", 4))
    reader = RowReader(paths, columns=["reward"])
    batches = reader.batches()
    one = next(batches)
    assert one.column("job_id").to_pylist() == ["a-0000", "a-0001", "a-0002"]
    assert "reward" in one.schema.names and "prompt_ids" not in one.schema.names
    after_one = str(reader.cursor)
    assert json.loads(after_one) == {"v": 1, "next": {"w1": 2}}
    # A crash here: a new reader from the persisted cursor gets everything else, once.
    resumed = [job for b in RowReader(paths, after_one).batches() for job in b.column("job_id").to_pylist()]
    assert sorted(resumed) == [f"b-{i:04d}" for i in range(2)] + [f"c-{i:04d}" for i in range(4)]
    rest = [job for b in batches for job in b.column("job_id").to_pylist()]
    assert rest == ["b-0000", "b-0001", "c-0000", "c-0001", "c-0002", "c-0003"]   # writers take turns
    assert list(RowReader(paths, reader.cursor).batches()) == []


def test_rows_held_by_a_cursor_come_first_as_one_batch(tmp_path: Path) -> None:
    """A groups() reader saved its cursor with half a group held; the batch reader resumes it."""
    paths = make_run(tmp_path / "run")
    writer = ShardWriter(paths, "w1", Shards())
    commit(writer, group_rows("g1", 2) + group_rows("g2", 3)[:2])
    grouped = RowReader(paths)
    assert [r["job_id"] for r in next(grouped.groups())] == ["g1-0000", "g1-0001"]
    assert grouped.held == 2
    reader = RowReader(paths, grouped.cursor)
    batches = reader.batches()
    held = next(batches)
    assert held.column("job_id").to_pylist() == ["g2-0000", "g2-0001"]
    assert held.column("reward").to_pylist() == [0.0, 1.0]
    assert json.loads(str(reader.cursor)) == {"v": 1, "next": {"w1": 2}}
    commit(writer, group_rows("g2", 3)[2:])
    assert [b.column("job_id").to_pylist() for b in batches] == [["g2-0002"]]
    assert reader.held == 0 and list(RowReader(paths, reader.cursor).batches()) == []


def test_a_closed_reader_leaves_no_read_ahead_thread_and_a_new_one_resumes(tmp_path: Path) -> None:
    import threading

    def read_ahead_threads() -> int:
        return sum(t.name.startswith("shard-read-ahead") for t in threading.enumerate())

    paths = make_run(tmp_path / "run")
    writer = ShardWriter(paths, "w1", Shards())
    commit(writer, group_rows("a", 2))
    commit(writer, group_rows("b", 2))
    before = read_ahead_threads()
    with RowReader(paths) as reader:
        first = next(reader.rows())
        assert read_ahead_threads() == before + 1   # the next shard is being decoded meanwhile
    assert read_ahead_threads() == before
    rest = [row["job_id"] for row in RowReader(paths, reader.cursor).rows()]
    assert [first["job_id"], *rest] == ["a-0000", "a-0001", "b-0000", "b-0001"]

"""Replay (Spool.query): each filter over rows a real run wrote, whole groups, damaged shards named."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import Shards
from orchestrator.spool.shardlog import shard_name
from orchestrator.spool.shards import ShardWriter
from orchestrator.trainer.api import Spool
from orchestrator.trainer.batch import GroupBatcher
from orchestrator.trainer.replay_filter import Query, QueryError
from tests.core.util import FAST, drain_with_a_worker

# prompt -> (reward of every sample, policy version); "p-fail" fails in RUN.
PROMPTS = {"p-low": (0.0, 1), "p-mid": (0.5, 2), "p-high": (1.0, 3), "p-fail": (1.0, 3)}


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Spool:
    """Rows a real local worker wrote with the sleep handler: 4 prompts x 3 samples."""
    spool = Spool.create(tmp_path_factory.mktemp("replay") / "run", **{**FAST, "pools.run": 8})
    tasks = [{"instance_id": prompt, "reward": reward, "policy_version": version,
              **({"fail": {"run": 1.0}} if prompt == "p-fail" else {})}
             for prompt, (reward, version) in PROMPTS.items()]
    report = spool.submit(tasks, handler="sleep", samples=3)
    assert report.jobs == 12 and not report.rejected, report.rejected
    drain_with_a_worker(spool.paths)
    return spool


def prompts_of(groups: list[list[dict[str, Any]]]) -> set[str]:
    return {row["instance_id"] for group in groups for row in group}


def test_every_finished_row_comes_back_in_whole_groups(real_run: Spool) -> None:
    replay = real_run.query()
    assert replay.rows == replay.rows_scanned == 12 and len(replay.groups) == 4
    for group in replay.groups:
        assert len(group) == 3 and len({r["group_id"] for r in group}) == 1
        assert [r["sample_index"] for r in group] == [0, 1, 2]
    assert replay.skipped == ()


@pytest.mark.parametrize(("fields", "expected"), [
    ({"reward_min": 0.4}, {"p-mid", "p-high"}),
    ({"reward_min": 0.4, "reward_max": 0.6}, {"p-mid"}),
    ({"version_min": 2, "version_max": 2}, {"p-mid"}),
    ({"version_min": 3}, {"p-high"}),                 # p-fail never ran its turn: no version
    ({"prompts": ["p-low", "p-high"]}, {"p-low", "p-high"}),
    ({"handlers": ["sleep"]}, set(PROMPTS)),
    ({"handlers": ["chat"]}, set()),
    ({"failed": True}, {"p-fail"}),
    ({"failed": False}, {"p-low", "p-mid", "p-high"}),
    ({"statuses": ["failed"]}, {"p-fail"}),
    ({"turns_max": 0}, set(PROMPTS)),                 # the sleep handler takes no model turn
    ({"turns_min": 1}, set()),
    ({"prompt_contains": "p-mid"}, {"p-mid"}),
])
def test_each_filter_selects_its_groups(real_run: Spool, fields: dict[str, Any], expected: set[str]) -> None:
    assert prompts_of(real_run.query(**fields).groups) == expected


def test_a_group_filter_and_the_batcher_take_the_groups_as_they_come(real_run: Spool) -> None:
    group = real_run.query(prompts=["p-mid"]).groups[0][0]["group_id"]
    replay = real_run.query(groups=[group], failed=False)
    assert [r["group_id"] for r in replay.groups[0]] == [group] * 3
    batch = GroupBatcher(pad_id=0).build(real_run.query(failed=False).groups)
    assert len(batch) == 9


def test_a_query_that_cannot_match_is_refused() -> None:
    with pytest.raises(QueryError, match="reward_min"):
        Query(reward_min=1.0, reward_max=0.0)
    with pytest.raises(QueryError, match="valid are ok, failed"):
        Query(statuses=("done",))


def rows(group: str, rewards: list[float | None], turns: int = 0) -> list[dict[str, Any]]:
    return [{"job_id": f"{group}-{i}", "group_id": group, "group_size": len(rewards), "sample_index": i,
             "instance_id": group, "handler": "chat", "status": "ok", "reward": reward,
             "turns": [{"output_ids": [1]}] * turns} for i, reward in enumerate(rewards)]


def commit(writer: ShardWriter, batch: list[dict[str, Any]]) -> None:
    for row in batch:
        writer.add(row, row["job_id"])
    writer.commit()


def test_a_group_split_across_writers_comes_back_whole_when_one_row_matches(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run")
    first, second = ShardWriter(spool.paths, "w1", Shards()), ShardWriter(spool.paths, "w2", Shards())
    split = rows("g-split", [0.0, 1.0, 0.0])
    commit(first, split[:2] + rows("g-other", [0.0, 0.0]))
    commit(second, split[2:])
    replay = spool.query(reward_min=1.0)
    assert [[r["job_id"] for r in g] for g in replay.groups] == [["g-split-0", "g-split-1", "g-split-2"]]
    assert replay.rows_selected == 1 and replay.rows_scanned == 5


def test_turn_counts_and_incomplete_groups(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run")
    writer = ShardWriter(spool.paths, "w1", Shards())
    commit(writer, rows("g-short", [1.0, 0.0], turns=1) + rows("g-long", [1.0, 0.0], turns=5)
           + [{**row, "group_size": 4} for row in rows("g-part", [1.0, 0.0], turns=5)])
    assert prompts_of(spool.query(turns_min=2).groups) == {"g-long", "g-part"}
    assert prompts_of(spool.query(turns_max=1).groups) == {"g-short"}
    complete = spool.query(turns_min=2, complete=True)
    assert prompts_of(complete.groups) == {"g-long"} and complete.incomplete_groups == 1


def test_a_damaged_shard_is_named_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool.create(tmp_path / "run")
    writer = ShardWriter(spool.paths, "w1", Shards())
    commit(writer, rows("g-1", [0.0, 1.0]))
    commit(writer, rows("g-2", [0.0, 1.0]))
    damaged = spool.paths.shards / shard_name("w1", 2)
    damaged.write_bytes(damaged.read_bytes()[:100])      # torn by a crash
    with caplog.at_level(logging.WARNING):
        replay = spool.query(reward_min=0.5)
    assert prompts_of(replay.groups) == {"g-1"}
    assert len(replay.skipped) == 1 and replay.skipped[0].startswith(f"shards/{damaged.name}: ArrowInvalid: ")
    assert damaged.name in caplog.text


def test_a_row_without_a_group_id_is_its_own_group_and_breaks_no_query(tmp_path: Path) -> None:
    """The last-resort `failed` row of a poisoned one keeps only job_id, status, error_stage, error."""
    spool = Spool.create(tmp_path / "run")
    writer = ShardWriter(spool.paths, "w1", Shards())
    orphan = {"job_id": "lost", "status": "failed", "error_stage": "commit", "error": "RowEncodingError: ..."}
    commit(writer, rows("g-1", [0.0, 1.0]) + [orphan])
    assert [len(g) for g in spool.query().groups] == [2, 1]
    assert [[r["job_id"] for r in g] for g in spool.query(failed=True).groups] == [["lost"]]
    assert prompts_of(spool.query(reward_min=0.5).groups) == {"g-1"}

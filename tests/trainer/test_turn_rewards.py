"""Per-turn rewards: a handler's `turn_rewards` go through a real worker, a shard and the tail into
GroupBatcher's token-level scores, each on the last token of its turn (a cap scales a sample's
total); malformed ones are refused with a reason, and shards written before the columns existed
still read and batch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from hpc_rollout.handlers.chat import ChatHandler
from orchestrator.devserver.local_server import local_server
from orchestrator.handler_api import contract as handler_module
from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.schema import Kind, instance_key
from orchestrator.llm.registry import BackendRegistry
from orchestrator.trainer import GroupBatcher
from orchestrator.trainer.api import Spool
from orchestrator.trainer.tail import TRAINER_COLUMNS
from tests.core.util import FAST, serve_in_process
from tests.llm.helpers import chat_instance

pytestmark = pytest.mark.llm
NEW_COLUMNS = ("staleness", "turn_spans", "turn_rewards")


class RewardedChat(ChatHandler):
    """chat, with a reward per reply: 0.1, 0.2, 0.3 ... (or whatever the instance says)."""

    name = "rewarded_chat"
    instance_schema = ChatHandler.instance_schema.merged([instance_key(
        "turn_rewards", Kind.LIST, "what eval returns as the turn rewards (this test's handler only)")])

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        given = ctx.job.instance.get("turn_rewards")
        rewards = given if given is not None else [round(0.1 * (i + 1), 3) for i in range(len(result["turns"]))]
        return {**await super().eval(ctx, result), "turn_rewards": rewards}


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    handler_module._loaded[RewardedChat.name] = RewardedChat
    try:
        with local_server(tiny=True) as url:
            spool = Spool.create(tmp_path / "run", **FAST)
            BackendRegistry(spool.paths).add(url, version=5)
            yield spool
    finally:
        handler_module._loaded.pop(RewardedChat.name, None)


def groups_of(spool: Spool) -> list[list[dict[str, Any]]]:
    reader = spool.reader(columns=TRAINER_COLUMNS)
    try:
        return [group for group in iter(lambda: reader.next_group(0.1), None)]
    finally:
        reader.close()


def test_turn_rewards_round_trip_from_the_handler_to_token_level_scores(spool: Spool) -> None:
    for report in (spool.submit([chat_instance(n_user_turns=2)], handler=RewardedChat.name, samples=3,
                                sampling={"max_tokens": 6}),
                   spool.submit([{**chat_instance(n_user_turns=2), "turn_rewards": [0.5]}],   # 1 for 3 turns
                                handler=RewardedChat.name)):
        assert not report.rejected, report.rejected
    serve_in_process(spool.paths, timeout=180)
    groups = groups_of(spool)
    good = next(g for g in groups if len(g) == 3)
    [bad] = next(g for g in groups if len(g) == 1)
    assert bad["turn_rewards"] is None and bad["status"] == "ok"
    full_bad = next(r for r in spool.reader().rows() if r["job_id"] == bad["job_id"])
    assert "3 turn(s)" in json.loads(full_bad["result"])["turn_rewards_error"]

    for row in good:
        assert list(row["turn_rewards"]) == pytest.approx([0.1, 0.2, 0.3])
        assert [s["policy_version"] for s in row["turn_spans"]] == [5, 5, 5]
    batch = GroupBatcher().build([good]).numpy()
    capped = GroupBatcher(turn_reward_cap=0.3).build([good]).numpy()
    width = batch["responses"].shape[1]
    for line, row in enumerate(good):
        expected = np.zeros(width, dtype=np.float32)
        for span, reward in zip(row["turn_spans"], row["turn_rewards"]):
            expected[span["end"] - 1] += reward                   # each turn's reward on its last token
        expected_capped = expected * (0.3 / 0.6)                  # |0.1| + |0.2| + |0.3| = 0.6 > cap 0.3
        last = len(row["response_ids"]) - 1
        expected[last] += row["reward"]                           # the outcome on the last response token
        expected_capped[last] += row["reward"]
        assert batch["token_level_scores"][line] == pytest.approx(expected, abs=1e-6)
        assert capped["token_level_scores"][line] == pytest.approx(expected_capped, abs=1e-6)
        versions = batch["token_policy_versions"][line]
        sampled = batch["response_mask"][line].astype(bool)
        assert (versions[sampled] == 5).all() and (versions[~sampled] == -1).all()
    assert batch["rewards"] == pytest.approx([r["reward"] for r in good])   # the outcome stays the reward
    tensors = GroupBatcher().build([good]).tensors()
    assert tensors["token_level_scores"].shape == tensors["responses"].shape


def test_shards_without_the_new_columns_still_read_and_batch(spool: Spool) -> None:
    spool.submit([chat_instance(n_user_turns=1)], handler="chat", samples=2, sampling={"max_tokens": 4})
    serve_in_process(spool.paths, timeout=180)
    for shard in spool.paths.shards.glob("*.parquet"):   # as a shard written before issue 26 looks
        table = pq.read_table(shard)
        pq.write_table(table.drop_columns([c for c in NEW_COLUMNS if c in table.column_names]), shard)
    [group] = groups_of(spool)
    assert all(row.get(column) is None for row in group for column in NEW_COLUMNS)   # read as nulls (spool/shard_reader.py)
    batch = GroupBatcher().build([group]).numpy()
    assert (batch["token_policy_versions"] == -1).all() and batch["token_level_scores"].sum() == pytest.approx(
        sum(r["reward"] for r in group))

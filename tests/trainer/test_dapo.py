"""The async DAPO sampler with a seeded sleep handler: no constant group, and no waiting for the queue."""

from __future__ import annotations

from pathlib import Path

from orchestrator.trainer.api import Spool
from orchestrator.report.status import pending_count
from orchestrator.trainer import DynamicSampler
from tests.core.util import FAST, start_worker, stop_worker, wait_until


def prompts() -> list[dict]:
    """A third of the prompts always pay 0, a third always 1 (zero variance), a third sometimes."""
    run = {"lognormal": {"mean": 0.15, "sigma": 0.5}, "tail_p": 0.1, "tail_factor": 8}
    return [{"run": run, "seed": i, "reward": {"bernoulli": [0.0, 1.0, 0.5][i % 3]}} for i in range(60)]


def test_no_constant_group_comes_back_and_the_batch_returns_before_the_queue_drains(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run", **{**FAST, "pools.run": 16, "shards.idle_flush_s": 0.05})
    sampler = DynamicSampler(spool, prompts(), handler="sleep", samples=4, informative_groups=3)
    worker = start_worker(spool.paths)
    try:
        first = sampler.next_batch(policy_version=0, timeout_s=120)
        left_running = pending_count(spool.paths)
        second = sampler.next_batch(policy_version=1, timeout_s=120)
        sampler.close()
    finally:
        stop_worker(worker)
    for batch in (first, second):
        assert len(batch.groups) == 3
        for group in batch.groups:
            assert len(group) == 4 and len({r["reward"] for r in group}) > 1, "a zero-variance group was returned"
        assert len(batch.batch) == 12 and set(batch.batch.numpy()["rewards"].tolist()) == {0.0, 1.0}
    assert first.stats.in_flight > 0 and left_running > 0, "the sampler waited for the whole queue"
    totals = sampler.totals
    assert totals.zero_variance > 0 and 0 < totals.filtered_share < 1
    assert totals.informative == 6 and totals.submitted_groups >= 6 + totals.zero_variance


def test_leftovers_can_be_cancelled(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run", **{**FAST, "pools.run": 16, "shards.idle_flush_s": 0.05})
    sampler = DynamicSampler(spool, prompts(), handler="sleep", samples=4, informative_groups=2,
                             in_flight=12, leftovers="cancel")
    worker = start_worker(spool.paths)
    try:
        batch = sampler.next_batch(policy_version=0, timeout_s=120)
        assert batch.stats.leftovers_cancelled > 0 and batch.stats.in_flight == 0
        wait_until(lambda: pending_count(spool.paths) == 0, 120, "cancelled leftovers to end")
    finally:
        stop_worker(worker)
    statuses = {r["status"] for group in batch.groups for r in group}
    assert statuses == {"ok"}

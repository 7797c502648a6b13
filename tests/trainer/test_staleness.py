"""The staleness bound: stale rows are excluded and counted; jobs that can only end stale are cancelled."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.trainer.api import Spool
from orchestrator.config import ConfigError
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.staleness import row_is_stale, stale_reason
from orchestrator.trainer import DynamicSampler
from tests.core.util import FAST, rows, start_worker, stop_worker, wait_drained


def test_which_rows_are_stale() -> None:
    assert row_is_stale({"policy_version_min": 3}, current_version=5, max_policy_lag=1)
    assert not row_is_stale({"policy_version_min": 4}, current_version=5, max_policy_lag=1)
    assert not row_is_stale({"policy_version_min": 0}, current_version=5, max_policy_lag=-1)     # no bound
    assert not row_is_stale({"policy_version_min": None}, current_version=5, max_policy_lag=0)   # no LLM
    assert row_is_stale({"policy_version_min": 5, "error": "stale_policy: sampled with 4"}, 5, 1)
    assert stale_reason(2, 3) and stale_reason(3, 3) is None and stale_reason(None, 3) is None
    with pytest.raises(ConfigError, match="outside"):
        Spool.create("/nonexistent/never", **{"trainer.max_policy_lag": -2})


def _one_old_prompt_then_fresh_ones() -> Iterator[dict[str, object]]:
    # The sleep handler reports the version a prompt names, so this stand-in's old prompt comes
    # back stale every time it is submitted again, where a real one would sample the current
    # policy. It is named once: its retry holds one slot of four. Cycling [fresh, old] put a new
    # copy of it in flight every other refill, until copies held every slot and no fresh group was
    # ever submitted again (1 run in 3-6 timed out). Fresh groups take 0.3 s of RUN, so the old
    # one is judged (stale) before three fresh ones can fill the batch.
    yield {"policy_version": 2, "reward": {"bernoulli": 0.5}, "seed": 0}      # 5 - 2 > lag 1
    for seed in itertools.count(1):
        yield {"policy_version": 5, "reward": {"bernoulli": 0.5}, "seed": seed, "run": 0.3}


def test_stale_rows_are_excluded_counted_and_their_prompts_submitted_again(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run", **FAST, **{"trainer.max_policy_lag": 1})
    sampler = DynamicSampler(spool, _one_old_prompt_then_fresh_ones(), handler="sleep", samples=4,
                             informative_groups=3, in_flight=4)
    worker = start_worker(spool.paths)
    try:
        batch = sampler.next_batch(policy_version=5, timeout_s=120)
    finally:
        sampler.close()
        stop_worker(worker)
    stats = batch.stats
    assert stats.informative == 3 and stats.stale_groups >= 1 and stats.stale_rows == 4 * stats.stale_groups
    assert all(r["policy_version_min"] == 5 for group in batch.groups for r in group)
    assert sampler.totals.stale_rows == stats.stale_rows


def test_queued_jobs_that_sampled_too_old_a_policy_end_cancelled_as_stale(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run", **FAST)
    BackendRegistry(spool.paths).set_versions([], version=4, min_version=3)    # the trainer moved on: lag 1
    spool.submit([{"policy_version": 2, "run": 0.2}, {"policy_version": 3, "run": 0.2}], handler="sleep", samples=2)
    worker = start_worker(spool.paths)
    try:
        wait_drained(spool.paths)
    finally:
        stop_worker(worker)
    outcome = {(r["policy_version_min"], r["status"], (r["error"] or "").split(":")[0]) for r in rows(spool.paths)}
    assert outcome == {(2, "cancelled", "stale_policy"), (3, "ok", "")}
    assert all(r["eval_s"] in (None, 0.0) for r in rows(spool.paths) if r["status"] == "cancelled")   # EVAL skipped


def _one_old_prompt_then_fresh_ones_slowly() -> Iterator[dict[str, object]]:
    yield {"policy_version": 2, "reward": {"bernoulli": 0.5}, "seed": 0, "instance_id": "old"}
    for seed in itertools.count(1):
        yield {"policy_version": 5, "reward": {"bernoulli": 0.5}, "seed": seed, "run": 0.4}


def test_a_prompt_dropped_as_stale_once_is_submitted_again_as_a_partial_rollout(tmp_path: Path) -> None:
    """Under restart, a slow prompt can turn stale at every try and never be trained on (issue 36:
    benchmarks.staleness measured the slow prompts' share of trained samples fall to 0 when their
    episodes outlast two swaps). So its second try keeps its turns: staleness continue."""
    spool = Spool.create(tmp_path / "run", **FAST, **{"trainer.max_policy_lag": 1})
    sampler = DynamicSampler(spool, _one_old_prompt_then_fresh_ones_slowly(), handler="sleep", samples=2,
                             informative_groups=4, in_flight=3)
    worker = start_worker(spool.paths)
    try:
        sampler.next_batch(policy_version=5, timeout_s=120)
    finally:
        sampler.close()
        stop_worker(worker)
    tries = sorted({(r["group_id"], r["staleness"]) for r in rows(spool.paths) if r["instance_id"] == "old"})
    stalenesses = [staleness for _, staleness in tries]   # group ids sort by submission
    assert len(stalenesses) >= 2, tries
    assert stalenesses[0] == "restart" and set(stalenesses[1:]) == {"continue"}, tries

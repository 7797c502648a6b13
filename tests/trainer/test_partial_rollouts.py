"""Partial rollouts: a weight swap in the middle of episodes, on the reference server with a real
reload and real workers. `continue` keeps the finished turns (ids, logprobs, versions) and goes on
with the new weights, regenerating nothing; `restart` cancels the job as before. An abort on swap
ends a long generation early; the session resumes it on the new weights as the next request."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.devserver.tiny_model import save_perturbed_copy, tiny_model_dir
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.events import events_named
from orchestrator.spool.staleness import row_is_stale
from orchestrator.trainer import GroupBatcher
from orchestrator.trainer.api import Spool
from orchestrator.trainer.turn_tokens import mask_stale_turns
from tests.core.util import FAST, rows, start_worker, stop_worker, wait_drained, wait_until
from tests.llm.helpers import chat_instance

pytestmark = pytest.mark.llm
# Turns per episode. The swap must land mid-episode: it took 0.29 s here, in which the episodes of
# 11 turns of 8 tokens finished all their remaining 32 turns (serve-llm batches rows as `generate`
# does now), so they ran whole on the old policy. 21 turns of 16 tokens leave ~5x that work to do
# (~1,200 tokens a conversation, within serve-llm's 2,048).
TURNS = 21


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, Path, Path]]:
    """One serve-llm --tiny (a real model) recording every generation, and a checkpoint to swap to."""
    base = tmp_path_factory.mktemp("partial")
    record = base / "record.jsonl"
    checkpoint = save_perturbed_copy(tiny_model_dir(), base / "ckpt-1", seed=3)
    server = start_server(tiny=True, record=record)
    try:
        yield server, record, checkpoint
    finally:
        server.stop()


def generations(record: Path, skip: int = 0) -> list[dict[str, Any]]:
    """The server's recorded generations; a last line without its newline is still being written."""
    text = record.read_text() if record.exists() else ""
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()[skip:]]


def test_a_record_line_still_being_written_is_not_read_yet(tmp_path: Path) -> None:
    # serve-llm appends while the tests poll its record: a CI run (3 workers) read a line torn at 240 bytes
    record = tmp_path / "record.jsonl"
    record.write_text('{"endpoint": "/v1/completions"}\n{"time": 1, "prompt_ids": [1, 2717, 2')
    assert generations(record) == [{"endpoint": "/v1/completions"}]


def in_flight(url: str) -> float:
    """Requests the server is generating (its vLLM-style /metrics)."""
    page = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in page.splitlines() if line.startswith("vllm:num_requests_running"))


def back_to_original_weights(spool: Spool) -> None:
    spool.swap_weights(tiny_model_dir(), version=2, max_policy_lag=-1, abort=False)


def swap_mid_episode(served: tuple[LocalServer, Path, Path], run_dir: Path, staleness: str) -> tuple[Spool, list[dict[str, Any]]]:
    """Four chat jobs of TURNS turns each; the weights swap (version 0 -> 1, lag 0: only version 1
    is trained on from then) once a few turns are done. Returns the spool and the generations."""
    server, record, checkpoint = served
    spool = Spool.create(run_dir, **{**FAST, "pools.run": 4, "trainer.max_policy_lag": 0})
    BackendRegistry(spool.paths).add(server.url, version=0)
    before = len(generations(record))
    spool.submit([chat_instance(n_user_turns=TURNS - 1)] * 4, handler="chat", sampling={"max_tokens": 16},
                 staleness=staleness)
    worker = start_worker(spool.paths)
    try:
        wait_until(lambda: len(generations(record, before)) >= 8, 120, "the first turns")
        spool.swap_weights(checkpoint, version=1, max_policy_lag=0, abort=False)
        wait_drained(spool.paths, timeout=240)
    finally:
        stop_worker(worker)
    back_to_original_weights(spool)
    return spool, generations(record, before)


def test_continue_keeps_the_finished_turns_and_finishes_on_the_new_version(
        tmp_path: Path, served: tuple[LocalServer, Path, Path]) -> None:
    spool, generated = swap_mid_episode(served, tmp_path / "run", "continue")
    finished = rows(spool.paths)
    assert len(finished) == 4 and {r["status"] for r in finished} == {"ok"}, [r["error"] for r in finished]
    assert {r["staleness"] for r in finished} == {"continue"}
    spanning = [r for r in finished if {t["policy_version"] for t in r["turns"]} == {0, 1}]
    assert spanning, ("no episode spanned the swap: the test did not exercise a partial rollout",
                      [[t["policy_version"] for t in r["turns"]] for r in finished])

    # Nothing was generated twice: every generation the server made is one turn of one row.
    turns = [t for r in finished for t in r["turns"]]
    assert len(turns) == len(generated) == 4 * TURNS
    served_turns = {(tuple(g["prompt_ids"]), tuple(g["output_ids"])) for g in generated}
    assert {(tuple(t["input_ids"]), tuple(t["output_ids"])) for t in turns} == served_turns

    for row in spanning:
        versions = [t["policy_version"] for t in row["turns"]]
        assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == 1   # finished on the new weights
        # The first turns' tokens and logprobs are in the trajectory as sampled, each turn at its place.
        spans = row["turn_spans"]
        assert all(span is not None for span in spans)
        for turn, span in zip(row["turns"], spans):
            assert list(row["response_ids"][span["start"]:span["end"]]) == list(turn["output_ids"])
            assert list(row["logprobs"][span["start"]:span["end"]]) == pytest.approx(list(turn["logprobs"]))
            assert span["policy_version"] == turn["policy_version"]

    # The trainer at version 1 with lag 0: no row is stale; the version-0 turns leave the loss mask.
    for row in finished:
        assert not row_is_stale(row, current_version=1, max_policy_lag=0)
    row = spanning[0]
    masked_row, masked = mask_stale_turns(row, min_version=1)
    old_tokens = sum(len(t["output_ids"]) for t in row["turns"] if t["policy_version"] == 0)
    assert masked == old_tokens > 0
    # an int8 array: summed by numpy (a Python sum of its int8 items wraps past 127)
    assert int(masked_row["response_mask"].sum()) == sum(row["response_mask"]) - old_tokens
    batch = GroupBatcher().build([[masked_row]]).numpy()
    versions = batch["token_policy_versions"][0]
    for turn, span in zip(row["turns"], row["turn_spans"]):
        assert set(versions[span["start"]:span["end"]]) == {turn["policy_version"]}
    assert (batch["response_mask"][0][versions == 0] == 0).all() and batch["response_mask"][0][versions == 1].all()
    assert events_named(spool.paths, "policy_continued"), "the continuation was not recorded"


def test_restart_cancels_the_jobs_that_sampled_the_old_policy(
        tmp_path: Path, served: tuple[LocalServer, Path, Path]) -> None:
    spool, generated = swap_mid_episode(served, tmp_path / "run", "restart")
    finished = rows(spool.paths)
    assert len(finished) == 4 and {r["staleness"] for r in finished} == {"restart"}
    cancelled = [r for r in finished if r["status"] == "cancelled"]
    assert cancelled and all(r["error"].startswith("stale_policy") for r in cancelled)
    assert all(r["policy_version_min"] == 1 for r in finished if r["status"] == "ok")
    # Their turns were generated and are lost: fewer turns in rows than generations served.
    assert sum(len(r["turns"] or []) for r in finished) < len(generated)
    assert all(row_is_stale(r, current_version=1, max_policy_lag=0) for r in cancelled)


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_abort_on_swap_resumes_the_generation_on_the_new_weights(
        tmp_path: Path, served: tuple[LocalServer, Path, Path], protocol: str) -> None:
    server, record, checkpoint = served
    spool = Spool.create(tmp_path / "run", **FAST, **{"trainer.staleness": "continue"})
    url = server.url if protocol == "vllm" else server.url.removesuffix("/v1")
    BackendRegistry(spool.paths).add(url, protocol=protocol, version=0)
    before = len(generations(record))
    budget = 1500   # seconds of generation on the tiny model: long enough to be cut
    spool.submit([{"messages": [{"role": "user", "content": "Tell me a long story."}]}], handler="chat",
                 sampling={"max_tokens": budget, "ignore_eos": True})
    worker = start_worker(spool.paths)
    try:
        wait_until(lambda: in_flight(server.url) > 0, 120, "the generation to start")
        time.sleep(0.3)
        report = spool.swap_weights(checkpoint, version=1, max_policy_lag=-1)   # abort: run.toml says continue
        wait_drained(spool.paths, timeout=240)
    finally:
        stop_worker(worker)
    back_to_original_weights(spool)
    assert report.aborted and not report.abort_unsupported
    [row] = rows(spool.paths)
    assert row["status"] == "ok", row["error"]
    first, second = row["turns"]
    assert first["finish_reason"] == "abort" and first["policy_version"] == 0 and 0 < len(first["output_ids"]) < budget
    assert second["policy_version"] == 1 and second["finish_reason"] == "length"
    assert list(second["input_ids"]) == list(first["input_ids"]) + list(first["output_ids"])   # resumed, not redone
    assert len(first["output_ids"]) + len(second["output_ids"]) == budget == sum(row["response_mask"])
    assert list(row["response_ids"]) == list(first["output_ids"]) + list(second["output_ids"])
    assert [(s["start"], s["end"], s["policy_version"]) for s in row["turn_spans"]] == [
        (0, len(first["output_ids"]), 0), (len(first["output_ids"]), budget, 1)]
    served_now = generations(record, before)
    assert [g["finish_reason"] for g in served_now[:2]] == ["abort", "length"]
    assert served_now[1]["prompt_ids"] == served_now[0]["prompt_ids"] + served_now[0]["output_ids"]
    assert events_named(spool.paths, "llm_aborted")

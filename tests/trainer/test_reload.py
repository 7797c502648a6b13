"""Weight reload while chat jobs run: nothing fails, later turns carry the new version, weights change."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from orchestrator.trainer.api import Spool
from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.devserver.tiny_model import save_perturbed_copy, tiny_model_dir
from orchestrator.llm.weights import ReloadFailed
from tests.core.util import FAST, rows, start_worker, stop_worker, wait_drained, wait_until
from tests.llm.helpers import chat_instance

pytestmark = pytest.mark.llm
PROBE = [1, 30, 31, 32, 33]   # one fixed prompt, sampled greedily before and after each reload


def greedy(url: str) -> list[float]:
    body = {"prompt": PROBE, "max_tokens": 4, "temperature": 0.0, "logprobs": 0, "return_token_ids": True}
    answer = httpx.post(f"{url}/completions", json=body, timeout=60).json()
    return answer["choices"][0]["logprobs"]["token_logprobs"]


def turns_recorded(record: Path) -> int:
    return sum(1 for _ in record.open()) if record.exists() else 0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, Path]]:
    """One serve-llm --tiny for the module (each test leaves it on the original weights)."""
    record = tmp_path_factory.mktemp("serve") / "record.jsonl"
    server = start_server(tiny=True, record=record)
    try:
        yield server, record
    finally:
        server.stop()


@contextmanager
def chat_jobs_running(served: tuple[LocalServer, Path], run_dir: Path, user_turns: int) -> Iterator[Spool]:
    """Six multi-turn chat jobs on the served model, one worker; yields once some turns are done,
    and waits for every job to finish on the way out."""
    server, record = served
    spool = Spool.create(run_dir, **{**FAST, "pools.run": 6})
    start = turns_recorded(record)
    BackendRegistry(spool.paths).add(server.url, version=0)
    spool.submit([chat_instance(n_user_turns=user_turns)] * 6, handler="chat", sampling={"max_tokens": 10})
    worker = start_worker(spool.paths)
    try:
        wait_until(lambda: turns_recorded(record) >= start + 7, 120, "the first turns")
        yield spool
        wait_drained(spool.paths, timeout=240)
    finally:
        stop_worker(worker)


def test_reload_while_chat_jobs_run(tmp_path: Path, served: tuple[LocalServer, Path]) -> None:
    server, record = served
    original = greedy(server.url)
    checkpoint = save_perturbed_copy(tiny_model_dir(), tmp_path / "ckpt-1", seed=1)
    with chat_jobs_running(served, tmp_path / "run", user_turns=4) as spool:
        asked = time.time()
        report = spool.swap_weights(checkpoint, version=1, max_policy_lag=-1)
        confirmed = time.time()
    reloaded = greedy(server.url)

    finished = rows(spool.paths)
    assert len(finished) == 6 and {r["status"] for r in finished} == {"ok"}, [r["error"] for r in finished]
    turns = [t for r in finished for t in r["turns"]]
    assert all(t["policy_version"] == 1 for t in turns if t["sent_at"] > confirmed)
    assert all(t["policy_version"] == 0 for t in turns if t["sent_at"] < asked)
    assert any({t["policy_version"] for t in r["turns"]} == {0, 1} for r in finished), "no job spanned the reload"
    assert reloaded != original                                          # the weights changed
    probes = [json.loads(line) for line in record.open() if json.loads(line)["prompt_ids"] == PROBE]
    assert [p["logprobs"] for p in probes] == [pytest.approx(original), pytest.approx(reloaded)]
    assert report.reloaded == (server.url,) and BackendRegistry(spool.paths).read().policy_version == 1
    print(f"reload_s={report.seconds:.3f}")

    # SGLang's route on the same server: back to the original weights, exactly.
    answer = httpx.post(server.url.removesuffix("/v1") + "/update_weights_from_disk",
                        json={"model_path": str(tiny_model_dir()), "weight_version": "7"}, timeout=60)
    assert answer.json()["success"] is True and greedy(server.url) == original
    assert httpx.get(server.url.removesuffix("/v1") + "/model_info").json()["weight_version"] == "7"

    # A checkpoint of another shape is refused; the version does not move.
    import torch
    from safetensors.torch import save_file

    (tmp_path / "wrong").mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "wrong" / "model.safetensors"))
    with pytest.raises(ReloadFailed, match="does not fit the served model"):
        spool.swap_weights(tmp_path / "wrong", version=2)
    assert BackendRegistry(spool.paths).read().policy_version == 1 and greedy(server.url) == original


def test_jobs_that_sampled_the_old_policy_are_cancelled_when_the_lag_is_exceeded(
        tmp_path: Path, served: tuple[LocalServer, Path]) -> None:
    server, _ = served
    checkpoint = save_perturbed_copy(tiny_model_dir(), tmp_path / "ckpt-1", seed=2)
    with chat_jobs_running(served, tmp_path / "run", user_turns=6) as spool:
        spool.swap_weights(checkpoint, version=1, max_policy_lag=0)    # only version 1 is trained on now
    httpx.post(server.url.removesuffix("/v1") + "/collective_rpc",
               json={"method": "reload_weights", "kwargs": {"weights_path": str(tiny_model_dir())}}, timeout=60)
    finished = rows(spool.paths)
    assert len(finished) == 6
    stale = [r for r in finished if r["status"] == "cancelled"]
    assert stale and all(r["error"].startswith("stale_policy") for r in stale)
    assert all(r["policy_version_min"] == 1 for r in finished if r["status"] == "ok")
    assert BackendRegistry(spool.paths).read().min_policy_version == 1

"""TRL's AsyncGRPOTrainer on the spool (issue 40): `SpoolRolloutWorker` (RolloutWorkerProtocol) and
`SpoolWeightTransfer` (WeightTransferProtocol), with a real local worker and serve-llm.

The trainer's own `train()` runs up to its training step, which needs a flash-attention kernel
fetched from a model hub (GPU only). Patched for this machine, inside the test: TRL's
get_peak_flops_per_device (it asks CUDA for the device's name)."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.llm.registry import BackendRegistry
from orchestrator.report.status import pending_count
from orchestrator.trainer.api import Spool
from orchestrator.trainer.tail import TRAINER_COLUMNS
from orchestrator.trainer.trl.async_worker import SpoolRolloutWorker, group_advantages
from orchestrator.trainer.trl.weight_transfer import SpoolWeightTransfer
from tests.trainer.trl_rig import digit_task, spool_with_a_worker_and_serve_llm

pytestmark = pytest.mark.llm
trl = pytest.importorskip("trl", reason="pip install 'hpc-rollout[trl]' (in the test extra: CI has it)")

@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Spool, Path]]:
    with spool_with_a_worker_and_serve_llm(tmp_path) as started:
        yield started


def take(worker: SpoolRolloutWorker, count: int, timeout_s: float = 180) -> list[Any]:
    deadline, got = time.monotonic() + timeout_s, []
    while len(got) < count:
        try:
            got.append(worker.rollout_buffer.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(f"{len(got)} of {count} samples after {timeout_s} s") from None
    return got


def test_samples_are_the_rows_and_weights_move_through_the_spool(running: tuple[Spool, Path], tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    spool, base = running
    worker = SpoolRolloutWorker(spool, ["say 3", "say 5"], num_generations=4, task_of=digit_task,
                                source_handlers={"toy/digits": "answer"}, sampling={"max_tokens": 3}, groups_ahead=2)
    transfer = SpoolWeightTransfer(spool, base, tmp_path / "ckpt")
    worker.start()
    try:
        first = take(worker, 8)
        model = AutoModelForCausalLM.from_pretrained(str(base))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.01 * torch.randn_like(parameter))
        transfer.init_weight_transfer()
        transfer.send_weights((name, p) for name, p in model.named_parameters())
        worker.update_model_version(1)
        later = take(worker, 4)
        while not any(s.model_version == 1 for s in later):   # groups queued before the swap drain first
            later += take(worker, 4)
    finally:
        worker.stop()
    assert transfer.version == 1 and BackendRegistry(spool.paths).read().policy_version == 1
    assert transfer.swaps[0].reloaded, "serve-llm loaded the streamed weights"
    rows = {tuple(r["prompt_ids"]) + tuple(r["response_ids"]): r for r in spool.reader(columns=TRAINER_COLUMNS).rows()}
    for sample in first:
        assert isinstance(sample, RolloutSample) and sample.model_version == 0
        row = rows[tuple(int(x) for x in sample.input_ids)]
        prompt = len(row["prompt_ids"])
        assert list(sample.completion_mask) == [0] * prompt + list(row["response_mask"])
        assert np.allclose(sample.old_log_probs[prompt:], np.asarray(row["logprobs"]) * np.asarray(row["response_mask"]))
    by_group: dict[int, list[float]] = {}
    for sample in first:
        by_group.setdefault(sample.group_id, []).append(sample.advantage)
    assert all(abs(sum(advantages)) < 1e-6 for advantages in by_group.values())
    deadline = time.monotonic() + 30
    while pending_count(spool.paths) and time.monotonic() < deadline:   # stop cancelled what was still queued
        time.sleep(0.2)
    assert pending_count(spool.paths) == 0
    with pytest.raises(RuntimeError, match="no sample from the spool"):
        worker.check_health(stale_after_s=0.0)


def test_group_advantages_leave_unscored_samples_at_zero() -> None:
    assert group_advantages([1.0, 0.0, None, 1.0, 0.0]) == pytest.approx([1.0, -1.0, 0.0, 1.0, -1.0], abs=1e-6)
    assert group_advantages([None, None]) == [0.0, 0.0] and group_advantages([1.0, 1.0]) == [0.0, 0.0]


def test_async_grpo_trainer_runs_on_the_spool_up_to_its_gpu_only_step(
        running: tuple[Spool, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trl.experimental.async_grpo.async_grpo_trainer as async_trainer
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    monkeypatch.setattr(async_trainer, "get_peak_flops_per_device", lambda *_, **__: 1e12)   # asks CUDA its name
    spool, base = running
    worker = SpoolRolloutWorker(spool, ["say 3"], num_generations=4, task_of=digit_task,
                                source_handlers={"toy/digits": "answer"}, sampling={"max_tokens": 3})
    transfer = SpoolWeightTransfer(spool, base, tmp_path / "ckpt")
    args = AsyncGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=1, report_to=[], bf16=False,
                           per_device_train_batch_size=4, token_budget=0)   # token_budget set: no vLLM to ask
    trainer = AsyncGRPOTrainer(model=str(base), reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                               args=args, train_dataset=Dataset.from_list([{"prompt": "say 3"}]),
                               rollout_worker=worker, weight_transfer=transfer)
    try:
        with pytest.raises(Exception) as stopped:
            trainer.train()
    finally:
        worker.stop()
    where = "".join(str(entry.path) + entry.name for entry in stopped.traceback)
    assert "_flash_attn" in where, f"stopped before the GPU-only kernel: {stopped.value!r}"
    # Before that: the initial sync went through the spool, the worker fed the trainer a batch.
    assert transfer.version >= 1 and transfer.swaps[0].reloaded
    assert worker._group_number >= 1 and worker._failure is None

"""`SpoolRolloutWorker`: TRL's `RolloutWorkerProtocol` (trl.experimental.async_grpo) fed by a spool.

AsyncGRPOTrainer drains `rollout_buffer` for scored samples and never waits for a step's own
rollouts. This worker keeps `groups_ahead` groups of the dataset's prompts queued in the spool
(each prompt one group of `num_generations` samples, `task_of(prompt)` its task), follows the
shards with the lossless reader, and turns every complete group into `RolloutSample`s:
`input_ids` = prompt ids + response ids, `completion_mask` = 0 over the prompt then the row's
response_mask (tool output and user turns stay 0), `old_log_probs` aligned with it (0 where the
mask is 0), the group-relative advantage (r - mean) / (std + 1e-8) over the samples that have a
reward, as TRL's own worker computes it, and `model_version` = the oldest policy of the row.
A sample without a row's response (failed, cancelled) is not sent; it is counted in
`metrics_queue` ("spool/not_ok"). Stale samples are the trainer's to drop (its max_staleness).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.spool import job_ids
from orchestrator.trainer.api import Spool
from orchestrator.trainer.tail import TRAINER_COLUMNS
from orchestrator.trainer.trl.groups import Prompt, Task, chat_task
from orchestrator.trainer.trl.samples import usable

log = logging.getLogger(__name__)
Row = Mapping[str, Any]


def sample_arrays(row: Row) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_ids, completion_mask, old_log_probs over the whole sequence of one usable row."""
    prompt = np.asarray(row["prompt_ids"], dtype=np.int64)
    response = np.asarray(row["response_ids"], dtype=np.int64)
    mask = np.asarray(row["response_mask"] if row.get("response_mask") is not None else np.ones(len(response)),
                      dtype=np.int64)
    logprobs = np.asarray(row["logprobs"] if row.get("logprobs") is not None else np.zeros(len(response)),
                          dtype=np.float32)
    pad = np.zeros(len(prompt))
    return (np.concatenate([prompt, response]), np.concatenate([pad, mask]).astype(np.int64),
            np.concatenate([pad, logprobs * mask]).astype(np.float32))


def group_advantages(rewards: Sequence[float | None]) -> list[float]:
    """(r - mean) / (std + 1e-8) over the rewarded samples (population std, as TRL's worker); 0 for the rest."""
    scored = np.array([r for r in rewards if r is not None and math.isfinite(r)], dtype=np.float64)
    if not len(scored):
        return [0.0] * len(rewards)
    mean, std = float(scored.mean()), float(scored.std())
    return [0.0 if r is None or not math.isfinite(r) else (r - mean) / (std + 1e-8) for r in rewards]


@dataclass
class SpoolRolloutWorker:
    spool: Spool
    prompts: Sequence[Prompt]
    num_generations: int
    make_sample: Callable[..., Any] | None = None   # default: TRL's RolloutSample when TRL is there, else a dict
    task_of: Callable[[Prompt], Task] = chat_task
    sampling: Mapping[str, Any] = field(default_factory=dict)
    source_handlers: Mapping[str, str] | None = None
    groups_ahead: int = 4
    poll_s: float = 0.05
    rollout_buffer: "queue.Queue[Any]" = field(default_factory=queue.Queue)
    metrics_queue: "queue.Queue[dict[str, float]]" = field(default_factory=queue.Queue)
    model_version: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _failure: BaseException | None = field(default=None, repr=False)
    _last_sample_at: float = field(default=0.0, repr=False)
    _open: dict[str, Prompt] = field(default_factory=dict, repr=False)   # group id -> its prompt
    _next_prompt: int = field(default=0, repr=False)
    _group_number: int = field(default=0, repr=False)

    # -- RolloutWorkerProtocol ------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        if self.make_sample is None:
            try:
                from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
                self.make_sample = RolloutSample
            except ImportError:
                pass   # plain dicts with RolloutSample's fields
        self._last_sample_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="spool-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following and cancel the groups still open: nothing keeps generating for nobody."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        if self._open:
            self.spool.cancel(groups=list(self._open))
            self._open.clear()

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        if self._failure is not None:
            raise RuntimeError(f"the spool rollout worker failed: {type(self._failure).__name__}: {self._failure}")
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RuntimeError("the spool rollout worker's thread ended")
        quiet = time.monotonic() - self._last_sample_at
        if quiet > stale_after_s:
            raise RuntimeError(f"no sample from the spool for {quiet:.0f} s (> {stale_after_s:.0f} s): are workers "
                               f"running and backends registered? hpc-rollout status {self.spool.paths.root}")

    # -- the loop -------------------------------------------------------------------------------
    def _run(self) -> None:
        reader = self.spool.reader(columns=TRAINER_COLUMNS, poll_s=self.poll_s)
        try:
            while not self._stop.is_set():
                self._top_up()
                for group in reader.groups(follow=False):
                    self._emit(group)
                self._stop.wait(self.poll_s)
        except BaseException as exc:   # noqa: BLE001   kept for check_health, which the trainer calls
            self._failure = exc
            log.exception("the spool rollout worker stopped")
        finally:
            reader.close()

    def _top_up(self) -> None:
        missing = self.groups_ahead - len(self._open)
        if missing <= 0 or not self.prompts:
            return
        chosen = [self.prompts[(self._next_prompt + i) % len(self.prompts)] for i in range(missing)]
        self._next_prompt += missing
        report = self.spool.submit([self.task_of(p) for p in chosen], samples=self.num_generations,
                                   sampling=dict(self.sampling) or None,
                                   source_handlers=dict(self.source_handlers) if self.source_handlers else None)
        if report.rejected:
            raise ValueError(f"submit refused {len(report.rejected)} task(s): {report.rejected[0].reason}")
        for index, prompt in enumerate(chosen):
            self._open[job_ids.group_id(report.submission_id, index)] = prompt

    def _emit(self, group: Sequence[Row]) -> None:
        prompt = self._open.pop(str(group[0]["group_id"]), None)
        if prompt is None:
            return   # another submitter's group in the same spool
        rewards = [float(r["reward"]) if usable(r) and r.get("reward") is not None else None for r in group]
        advantages = group_advantages(rewards)
        number, self._group_number = self._group_number, self._group_number + 1
        now = time.time()
        for row, reward, advantage in zip(group, rewards, advantages):
            if not usable(row):
                self.metrics_queue.put_nowait({"spool/not_ok": 1.0})
                continue
            input_ids, completion_mask, old_log_probs = sample_arrays(row)
            version = row.get("policy_version_min")
            fields = {"prompt": prompt, "completion": [], "input_ids": input_ids, "completion_mask": completion_mask,
                      "old_log_probs": old_log_probs, "advantage": float(advantage),
                      "model_version": int(version) if version is not None else 0, "group_id": number,
                      "metrics": {"reward": float(reward or 0.0)}, "enqueued_at": now}
            self.rollout_buffer.put_nowait(self.make_sample(**fields) if self.make_sample else fields)
            self._last_sample_at = time.monotonic()

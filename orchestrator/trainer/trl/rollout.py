"""`SpoolRollout`: GRPOTrainer's `rollout_func` over a spool (TRL >= 1.16).

Each call (one per generation step):
1. the prompts (each repeated num_generations times by TRL) become spool groups, one per distinct
   prompt, `task_of(prompt)` making its task (default: a `chat` job), sampling from the trainer's
   config (temperature, top_p, top_k, max_completion_length) over `sampling`;
2. the rows are followed with the lossless reader until every sample has one or `time_limit_s`
   passes; then what is left is cancelled and waited for, `cancel_grace_s` at most, so nothing of
   the step still generates when the trainer updates (orchestrator/trainer/time_limit.py);
3. the entries go back in TRL's order (samples.py): ids, log-probs, env_mask, and the spool's
   reward, status, policy version and job id for the reward functions.

Off-policy samples: TRL uses the returned log-probs only for `off_policy_mask_threshold` (and
vLLM's importance sampling); without it a sample of an older policy trains as on-policy. Policy
versions are counted in optimizer steps (SwapWeightsCallback pushes version = global_step), so a
row sampled before the last push is behind; every call counts such samples, and the first that
finds any while the threshold is unset warns, naming the setting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import HpcRolloutError
from orchestrator.llm.busy import busy_registered
from orchestrator.llm.registry import BackendRegistry
from orchestrator.trainer.api import Spool
from orchestrator.trainer.tail import TRAINER_COLUMNS, RowReader
from orchestrator.trainer.time_limit import Cut, GroupSlots, collect
from orchestrator.trainer.trl.groups import Prompt, Task, by_size, chat_task, equal_prompts, tasks_of
from orchestrator.trainer.trl.samples import Samples, samples_of
from orchestrator.spool import job_ids

log = logging.getLogger(__name__)


class RolloutRefused(HpcRolloutError, RuntimeError):
    """The step's prompts could not be queued as asked (names the rows and why)."""


@dataclass
class StepRecord:
    """What one call did: for logs, tests and `rollout.steps`."""

    samples: int
    groups: int
    seconds: float
    behind: int                 # samples sampled by a policy older than the trainer's
    not_ok: int                 # samples without a usable row (masked, spool_reward 0)
    cut: Cut | None


@dataclass
class SpoolRollout:
    spool: Spool
    task_of: Callable[[Prompt], Task] = chat_task
    sampling: Mapping[str, Any] = field(default_factory=dict)   # over the trainer's (e.g. {"max_tokens": 64})
    source_handlers: Mapping[str, str] | None = None            # verl-style rows: data_source -> handler
    time_limit_s: float | None = None
    cancel_grace_s: float = 30.0
    poll_s: float = 0.05
    steps: list[StepRecord] = field(default_factory=list)
    _reader: RowReader | None = field(default=None, repr=False)
    _warned_on_policy: bool = field(default=False, repr=False)

    def __call__(self, prompts: list[Prompt], trainer: Any) -> dict[str, list[Any]]:
        started = time.monotonic()
        reader = self._reader = self._reader or self.spool.reader(columns=TRAINER_COLUMNS, poll_s=self.poll_s)
        placement, group_of_slot = self._submit(prompts, trainer)
        slots, cut = collect(reader, placement, len(prompts), self.spool.paths,
                             lambda groups: self.spool.cancel(groups=groups), self.time_limit_s,
                             self.cancel_grace_s, self.poll_s, started,
                             busy=lambda: busy_registered(BackendRegistry.of(self.spool.paths)))
        tokenizer = _tokenizer_of(trainer)
        samples = samples_of(slots, group_of_slot, lambda i: _render(tokenizer, prompts[i]), _eos_id(tokenizer))
        self._record(samples, trainer, len(placement.rows_of_group), time.monotonic() - started, cut)
        return samples.to_trl()

    def _submit(self, prompts: Sequence[Prompt], trainer: Any) -> tuple[GroupSlots, list[int]]:
        placement, group_of_slot = GroupSlots({}), [0] * len(prompts)
        sampling = {**trainer_sampling(trainer), **self.sampling}
        task_number = 0
        for samples, members in by_size(equal_prompts(prompts)).items():
            report = self.spool.submit(tasks_of(prompts, members, self.task_of), samples=samples, sampling=sampling,
                                       source_handlers=dict(self.source_handlers) if self.source_handlers else None)
            if report.rejected:
                problems = "; ".join(f"prompt {members[p.line - 1][0]}: {p.reason}" for p in report.rejected[:3])
                raise RolloutRefused(f"{len(report.rejected)} of the step's tasks refused by submit: {problems}")
            for index, entries in enumerate(members):
                placement.rows_of_group[job_ids.group_id(report.submission_id, index)] = entries
                for entry in entries:
                    group_of_slot[entry] = task_number
                task_number += 1
        return placement, group_of_slot

    def _record(self, samples: Samples, trainer: Any, groups: int, seconds: float, cut: Cut | None) -> None:
        version = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        behind = sum(1 for v in samples.policy_version if 0 <= v < version)
        not_ok = sum(1 for status in samples.spool_status if status != "ok")
        self.steps.append(StepRecord(len(samples.job_id), groups, seconds, behind, not_ok, cut))
        threshold = getattr(getattr(trainer, "args", None), "off_policy_mask_threshold", None)
        if behind and threshold is None and not self._warned_on_policy:
            self._warned_on_policy = True
            log.warning("%d of %d samples were sampled by a policy older than step %d: TRL trains them as on-policy "
                        "unless GRPOConfig(off_policy_mask_threshold=...) is set (the spool's log-probs are returned "
                        "for it)", behind, len(samples.job_id), version)


def trainer_sampling(trainer: Any) -> dict[str, Any]:
    """The spool sampling of the trainer's generation settings (GRPOConfig's names)."""
    args = getattr(trainer, "args", None)
    sampling: dict[str, Any] = {}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("max_tokens", "max_completion_length")):
        value = getattr(args, theirs, None)
        if value is not None:
            sampling[ours] = value
    top_k = getattr(args, "top_k", None)
    if top_k:   # TRL's 0 / None: no top-k
        sampling["top_k"] = int(top_k)
    return sampling


def spool_reward(completions: list[Any], spool_reward: list[float], **_: Any) -> list[float]:
    """A reward function for GRPOTrainer: the reward the spool's handler gave each sample at EVAL."""
    return list(spool_reward)


def _tokenizer_of(trainer: Any) -> Any:
    tokenizer = getattr(trainer, "processing_class", None)
    return getattr(tokenizer, "tokenizer", tokenizer)   # a processor wraps its tokenizer


def _eos_id(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    return int(eos) if eos is not None else 0


def _render(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Prompt ids of a prompt no row of its group came back with (every sample of it failed; its
    entries are masked): rendered as the default chat task would be."""
    if tokenizer is None:
        return [0]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "\n".join(str(m.get("content", "")) for m in messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) or [_eos_id(tokenizer)]

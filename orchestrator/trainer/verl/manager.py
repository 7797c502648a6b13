"""`SpoolLoopManager`: the spool as verl's rollout engine (verl 0.9.1, no patch to verl).

    actor_rollout_ref.rollout.agent.agent_loop_manager_class=orchestrator.trainer.verl.SpoolLoopManager
    +hpc_rollout.spool=/scratch/spool/run1                # and the other keys of settings.py

verl's RayPPOTrainer builds it with `create(config=, llm_client=, teacher_client=,
reward_loop_worker_handles=)` and calls `generate_sequences(DataProto) -> DataProto` once per step
(and per validation batch). Each call:

1. groups the rows of verl's batch by `uid` (the trainer repeats each prompt rollout.n times,
   interleaved, under one uid) and submits each group as ONE spool group of that many samples:
   the verl row as it is (`raw_prompt` as its prompt, data_source, reward_model, extra_info,
   tools_kwargs, ...), its handler by data_source (hpc_rollout.source_handlers / run.toml
   [data_sources]) or hpc_rollout.handler, sampling from verl's rollout config;
2. follows the shards with the lossless reader until every sample has its row or the time limit
   passes; then cancels what is left and waits, for cancel_grace_s at most, until it is gone: rows
   in, claims released, requests aborted (orchestrator/trainer/time_limit.py); what was cut is in meta_info;
3. returns verl's layout in verl's row order (assemble.py): failed, timed-out and cancelled
   samples masked, counted in meta_info["hpc_rollout"] and, as shares, where verl logs them
   (outcomes.py); a batch of nothing but failures raises AllSamplesFailed; meta_info["timing"]
   with verl's agent_loop/* keys from our rows; `reward_extra_keys` for verl's extract_reward.

Servers and weights: servers.py. Log-prob honesty: the batch's rollout_log_probs must be the kind
verl's rollout.logprobs_mode names; a backend of the other kind is refused before anything is
submitted when verl uses them (calculate_log_probs or rollout_correction), else they are left out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from verl import DataProto                      # this module is imported only when verl is used
from verl.utils.ray_utils import auto_await

from orchestrator.trainer.api import Spool
from orchestrator.llm.busy import busy_registered
from orchestrator.llm.logprob_mode import LogprobMode, parse_logprob_mode
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool import job_ids
from orchestrator.spool.liveness import read_workers
from orchestrator.trainer.tail import TRAINER_COLUMNS
from orchestrator.trainer import verl_keys as keys
from orchestrator.trainer.verl.assemble import Assembled, assemble
from orchestrator.trainer.time_limit import Cut, collect
from orchestrator.trainer.verl.warm_up import WARM_UP_TOKENS, warm_up, warm_up_rows
from orchestrator.trainer.verl.outcomes import Outcomes, flag_samples, outcomes_of
from orchestrator.trainer.verl.routing import RouteLog
from orchestrator.trainer.verl.verl_config import rows_refusal
from orchestrator.trainer.verl.servers import (
    move_to_version, policy_version_of, register_verl_servers, verl_server_addresses,
)
from orchestrator.trainer.verl.settings import (
    LogprobModeMismatch, ManagerSettings, Sampling, VerlConfigError, parse_settings, to_plain,
)

log = logging.getLogger(__name__)

ROW_COLUMNS = (*TRAINER_COLUMNS, "init_s", "run_s", "eval_s", "queue_s", "attempt", "result", "tool_calls")
# Keys of verl's batch that are not the task: trainer bookkeeping, tensors, our own.
NOT_TASK_KEYS = {keys.UID, "dummy_tensor", "index", "__do_sample__", "priority", "agent_name", "raw_prompt_ids"}
MULTI_MODAL_INPUTS = "multi_modal_inputs"   # a non-tensor of verl's layout: `{}` per text sample


@dataclass
class BatchPlacement:
    """Where the samples of one verl batch went: spool (group, sample) -> verl row."""

    rows_of_group: dict[str, list[int]] = field(default_factory=dict)   # group id -> verl row per sample
    uids: list[Any] = field(default_factory=list)
    prompts: list[Any] = field(default_factory=list)                     # each verl row's chat messages

    def slot(self, group_id: str, sample_index: int) -> int | None:
        rows = self.rows_of_group.get(group_id)
        return rows[sample_index] if rows is not None and 0 <= sample_index < len(rows) else None


class SpoolLoopManager:
    """verl's AgentLoopManager contract over the spool; see the module doc."""
    TRANSFER_QUEUE = False   # the legacy trainer's contract; SpoolLoopManagerTQ speaks the v1 one

    def __init__(self, config: Any, llm_client: Any = None, teacher_client: Any = None,
                 reward_loop_worker_handles: Any = None, **_: Any) -> None:
        self.config = config
        _show_info_lines()
        _check_trainer(to_plain(config), self.TRANSFER_QUEUE)
        self.settings: ManagerSettings = parse_settings(config)
        self.routes = RouteLog(log)
        self.llm_client = llm_client
        if teacher_client is not None:
            raise VerlConfigError("on-policy distillation (a teacher client) is not supported by SpoolLoopManager: "
                                  "unset distillation, or use verl's AgentLoopManager")
        # Rewards are computed at EVAL on our workers (rm_scores in the batch), so verl's reward
        # loop workers are never called: verl skips its own scoring when rm_scores is present.
        self.spool = _open_spool(self.settings)
        self.registry = BackendRegistry.of(self.spool.paths)
        self.reader = self.spool.reader(columns=ROW_COLUMNS, poll_s=self.settings.poll_s)
        self.registered: list[str] = []
        self.uses_rollout_log_probs = _uses_rollout_log_probs(to_plain(config))
        self._tokenizer: Any = None
        self.cut: Cut | None = None         # what the last step's time limit cut (orchestrator/trainer/time_limit.py)

    @classmethod
    @auto_await
    async def create(cls, *args: Any, **kwargs: Any) -> "SpoolLoopManager":
        """What verl calls (`Manager.create(config=..., llm_client=..., ...)`), awaited or not (verl's auto_await)."""
        manager = cls(*args, **kwargs)
        await manager._register_servers()
        await asyncio.to_thread(manager.warm_workers)
        return manager

    def warm_workers(self) -> None:
        """Fresh workers' one-off costs, paid here, before the first step and its time limit (warm_up.py)."""
        self._render([{"role": "user", "content": "warm-up"}])   # the tokenizer that masked samples' prompts need
        rows = warm_up_rows(to_plain(self.config), self.settings.handler)
        done = warm_up(self.spool, self.reader, rows, self.settings,
                       {**self._sampling({}, greedy=False), "max_tokens": WARM_UP_TOKENS})
        if done.skipped:
            log.info("hpc-rollout: no warm-up (%s)", done.skipped)
            return
        log.info("hpc-rollout: warm-up: %d job(s) of %d data source(s) on %d worker(s), %d ok, in %.1f s",
                 done.jobs, len(rows), done.workers, done.ok, done.seconds)
        if done.failures:
            log.warning("hpc-rollout: warm-up jobs failed: %s", " | ".join(done.failures))

    async def _register_servers(self) -> None:
        if self.llm_client is None or not self.settings.register_servers:
            return
        addresses = await verl_server_addresses(self.llm_client)
        self.registered = register_verl_servers(self.registry, addresses, self.settings)

    @auto_await
    async def generate_sequences(self, prompts: DataProto) -> DataProto:   # awaited or not, like verl's
        return await asyncio.to_thread(self.generate, prompts)

    def close(self) -> None:
        """Stop following the shards (nothing is running between two calls of generate_sequences)."""
        self.reader.close()

    # -- one batch ------------------------------------------------------------------------------
    def generate(self, prompts: DataProto) -> DataProto:
        """The synchronous core of generate_sequences (what a benchmark or a plain script calls)."""
        if not isinstance(prompts, DataProto):
            raise VerlConfigError(
                f"generate_sequences got a {type(prompts).__name__}: SpoolLoopManager speaks RayPPOTrainer's "
                "DataProto contract (the legacy trainer, trainer.use_v1=false); for verl's v1 trainer "
                "(TransferQueue) set agent_loop_manager_class=orchestrator.trainer.verl.SpoolLoopManagerTQ")
        started = time.monotonic()
        meta = dict(prompts.meta_info or {})
        version = policy_version_of(meta)
        if version is not None:
            move_to_version(self.registry, self.registered, version, self.settings.max_policy_lag)
        hand_logprobs = self._check_backends_logprobs(meta)
        self._check_rows(prompts.non_tensor_batch)
        placement = self._submit(prompts, meta)
        slots, waited = self._collect(placement, started)
        assembled = assemble(slots, placement.uids, self._fallback_prompts(slots, placement),
                             self.settings.prompt_length, self.settings.response_length,
                             pad_id=int(meta.get("pad_token_id") or 0), overlong=self.settings.overlong)
        outcome = self._outcome(assembled, slots, meta)
        hand_logprobs = hand_logprobs and self._check_rows_logprobs(slots)
        output = self._data_proto(assembled, slots, waited, time.monotonic() - started, hand_logprobs)
        output.meta_info[keys.TIMING].update(outcome.metrics())     # verl logs these as timing_s/hpc_rollout/...
        output.meta_info["hpc_rollout"]["first_failure"] = outcome.first_failure
        output.meta_info["hpc_rollout"]["time_limit"] = self.cut.to_json() if self.cut is not None else None
        return output

    def _check_rows(self, batch: Mapping[str, Any]) -> None:
        """Refuse rows that name a verl agent loop; say once per data_source which handler its rows go to."""
        problem = rows_refusal(batch.get("agent_name"))
        if problem:
            raise VerlConfigError(problem)
        self.routes.note(batch.get("data_source", ()), self.settings.source_handlers,
                         self.spool.config.data_sources, self.settings.handler)

    def _outcome(self, assembled: Assembled, slots: Sequence[Mapping[str, Any] | None],
                 meta: Mapping[str, Any]) -> Outcomes:
        """Masked samples said in the log; a batch of nothing but failures raised (outcomes.py)."""
        outcome = outcomes_of(assembled, slots, self.spool.paths.root)
        if outcome.masked:
            log.warning("hpc-rollout: %s", outcome.summary())
        outcome.check()
        if meta.get("validate"):
            flag_samples(assembled)    # verl logs a validation batch's reward extras, not its timing
        return outcome

    def _sampling(self, meta: Mapping[str, Any], greedy: bool) -> dict[str, Any]:
        chosen: Sampling = self.settings.validation_sampling if meta.get("validate") else self.settings.sampling
        params = {"max_tokens": self.settings.response_length, **chosen.params(), **self.settings.extra_sampling}
        if greedy or meta.get("do_sample") is False:
            params.update(temperature=0.0, top_p=1.0)
            params.pop("top_k", None)
        return params

    def _submit(self, prompts: Any, meta: Mapping[str, Any]) -> BatchPlacement:
        batch = prompts.non_tensor_batch
        size = len(prompts)
        uids = list(batch[keys.UID]) if keys.UID in batch else [f"row-{i}" for i in range(size)]
        greedy = batch.get("__do_sample__")
        groups: dict[tuple[Any, bool], list[int]] = {}
        for i in range(size):
            is_greedy = greedy is not None and not bool(greedy[i])
            groups.setdefault((uids[i], is_greedy), []).append(i)
        placement = BatchPlacement(uids=uids, prompts=[_plain(batch.get("raw_prompt", batch.get("prompt", [None] * size))[i])
                                                  for i in range(size)])
        # One submit per (group size, greedy): a submit gives all its tasks the same samples count.
        buckets: dict[tuple[int, bool], list[list[int]]] = {}
        for (uid, is_greedy), rows in groups.items():
            buckets.setdefault((len(rows), is_greedy), []).append(rows)
        spec = self.settings.reward_spec()
        for (samples, is_greedy), members in buckets.items():
            tasks = [self._task(batch, rows[0], spec) for rows in members]
            report = self.spool.submit(tasks, handler=self.settings.handler, samples=samples,
                                       sampling=self._sampling(meta, is_greedy),
                                       source_handlers=dict(self.settings.source_handlers) or None)
            if report.rejected:
                problems = "; ".join(f"row {members[p.line - 1][0]}: {p.reason}" for p in report.rejected[:3])
                raise VerlConfigError(f"{len(report.rejected)} verl row(s) refused by submit: {problems}")
            for index, rows in enumerate(members):
                placement.rows_of_group[job_ids.group_id(report.submission_id, index)] = rows
        return placement

    def _task(self, batch: Mapping[str, np.ndarray], i: int, reward_spec: dict[str, Any] | None) -> dict[str, Any]:
        task = {key: _plain(values[i]) for key, values in batch.items() if key not in NOT_TASK_KEYS}
        if "raw_prompt" in task:
            task["prompt"] = task.pop("raw_prompt")
        if reward_spec is not None:
            task["verl_reward"] = reward_spec
        return task

    def _collect(self, placement: BatchPlacement, started: float) -> tuple[list[Mapping[str, Any] | None], float]:
        """The row of every verl sample (None: none came), and the seconds waited; what the time limit
        cut is kept in `self.cut` (orchestrator/trainer/time_limit.py)."""
        slots, self.cut = collect(self.reader, placement, len(placement.uids), self.spool.paths,
                                  lambda groups: self.spool.cancel(groups=groups), self.settings.time_limit_s,
                                  self.settings.cancel_grace_s, self.settings.poll_s, started,
                                  busy=lambda: busy_registered(self.registry))
        return slots, time.monotonic() - started

    def _fallback_prompts(self, slots: Sequence[Mapping[str, Any] | None], placement: BatchPlacement) -> list[list[int]]:
        """Prompt ids for samples whose row has none: a sibling's, else the tokenizer's rendering."""
        out: list[list[int]] = [[] for _ in slots]
        for rows in placement.rows_of_group.values():
            sibling = next((list(slots[r]["prompt_ids"]) for r in rows if _has_prompt(slots[r])), None)  # type: ignore[index]
            for r in rows:
                if not _has_prompt(slots[r]):
                    out[r] = sibling if sibling is not None else self._render(placement.prompts[r])
        return out

    def _render(self, messages: Any) -> list[int]:
        if not messages:
            return [0]
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            path = self.settings.tokenizer
            if not path:
                return [0]   # masked anyway: one pad token keeps the sequence non-empty
            self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return list(self._tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                        return_dict=False))

    # -- log-prob honesty ---------------------------------------------------------------------
    def _check_backends_logprobs(self, meta: Mapping[str, Any]) -> bool:
        """True to hand rollout_log_probs; LogprobModeMismatch when verl needs them and would get the other kind."""
        expected = self.settings.logprobs_mode
        wrong = [b for b in self.registry.read().usable() if b.served_logprobs is not expected]
        if not wrong or self._identity_sampling(meta):
            return True
        if self.uses_rollout_log_probs:
            listing = ", ".join(f"{b.url} ({b.served_logprobs.value})" for b in wrong)
            raise LogprobModeMismatch(
                f"verl expects {expected.value} logprobs (actor_rollout_ref.rollout.logprobs_mode) but backend(s) "
                f"{listing} return the other kind: start them with the matching mode (vLLM --logprobs-mode "
                f"{expected.value}_logprobs; serve-llm --logprobs-mode {expected.value}) and add them again "
                f"(`hpc-rollout backend add RUN URL --logprob-mode {expected.value}` if they were recorded wrong), "
                f"or set actor_rollout_ref.rollout.logprobs_mode={wrong[0].served_logprobs.value}_logprobs")
        log.warning("backends return %s logprobs, verl's config names %s: rollout_log_probs left out (verl does not "
                    "use them: calculate_log_probs false, no rollout_correction)", wrong[0].served_logprobs.value,
                    expected.value)
        return False

    def _check_rows_logprobs(self, slots: Sequence[Mapping[str, Any] | None]) -> bool:
        expected = self.settings.logprobs_mode
        seen: set[LogprobMode] = set()
        for row in slots:
            mode = None if row is None else row.get("logprob_mode")
            for part in (mode or "").split(","):
                if part:
                    seen.add(parse_logprob_mode(part))
        wrong = seen - {expected}
        if not wrong:
            return True
        if self.uses_rollout_log_probs and not self._identity_sampling({}):
            raise LogprobModeMismatch(
                f"rows of this batch carry {', '.join(sorted(m.value for m in wrong))} logprobs, verl expects "
                f"{expected.value}: a backend of the other kind was added while the batch ran; see `hpc-rollout "
                "backend list` and add it again with the right --logprob-mode")
        return False

    def _identity_sampling(self, meta: Mapping[str, Any]) -> bool:
        """Temperature 1, no top-p/top-k: raw and processed logprobs are the same numbers."""
        s = self.settings.validation_sampling if meta.get("validate") else self.settings.sampling
        return s.temperature == 1.0 and s.top_p == 1.0 and s.top_k <= 0

    # -- the result ----------------------------------------------------------------------------
    def _data_proto(self, assembled: Assembled, slots: Sequence[Mapping[str, Any] | None], waited: float,
                    seconds: float, hand_logprobs: bool) -> DataProto:
        import torch
        from tensordict import TensorDict

        tensors = {k: torch.from_numpy(v) for k, v in assembled.tensors.items()
                   if hand_logprobs or k != keys.ROLLOUT_LOG_PROBS}
        batch = TensorDict(tensors, batch_size=len(slots))
        meta = {
            keys.TIMING: timing_of(slots, assembled, seconds),
            keys.REWARD_EXTRA_KEYS: assembled.reward_extra_keys,
            "hpc_rollout": {**assembled.counts.to_json(), "seconds": round(seconds, 3),
                            "rollout_log_probs": bool(hand_logprobs),
                            "logprobs_mode": self.settings.logprobs_mode.value},
        }
        # verl's own manager always returns multi_modal_inputs, `{}` for a text sample, and
        # RayPPOTrainer.fit reads it for every batch (ray_trainer.py:1556 in 0.9.1).
        non_tensors = {**assembled.non_tensors, MULTI_MODAL_INPUTS: _empty_dicts(len(slots))}
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)


def timing_of(slots: Sequence[Mapping[str, Any] | None], assembled: Assembled, seconds: float) -> dict[str, float]:
    """verl's agent_loop/* timing keys (AgentLoopManager._performance_metrics) from our rows."""
    rows = [r for r in slots if r is not None]
    generate = np.array([float(r.get("run_s") or 0.0) for r in rows] or [0.0])
    tools = np.array([sum(float(c.get("latency_ms") or 0.0) for c in (r.get("tool_calls") or [])) / 1000.0
                      for r in rows] or [0.0])
    score = np.array([float(r.get("eval_s") or 0.0) for r in rows] or [0.0])
    preempted = np.array([int(r.get("attempt") or 1) - 1 for r in rows] or [0])   # lost workers, preemptions
    timing: dict[str, float] = {}
    for name, values in (("generate_sequences", generate), ("tool_calls", tools), ("compute_score", score),
                         ("num_preempted", preempted)):
        timing[f"agent_loop/{name}/min"] = float(values.min())
        timing[f"agent_loop/{name}/max"] = float(values.max())
        timing[f"agent_loop/{name}/mean"] = float(values.mean())
    slowest = int(np.argmax(generate + tools + score))
    for name, values in (("generate_sequences", generate), ("tool_calls", tools), ("compute_score", score),
                         ("num_preempted", preempted)):
        timing[f"agent_loop/slowest/{name}"] = float(values[slowest])
    if rows:
        index = next(i for i, r in enumerate(slots) if r is rows[slowest])
        attention = assembled.tensors[keys.ATTENTION_MASK][index]
        width = assembled.tensors[keys.PROMPTS].shape[1]
        timing["agent_loop/slowest/prompt_length"] = float(attention[:width].sum())
        timing["agent_loop/slowest/response_length"] = float(attention[width:].sum())
    timing["hpc_rollout/generate_s"] = seconds
    timing["hpc_rollout/queue_s/mean"] = float(np.mean([float(r.get("queue_s") or 0.0) for r in rows] or [0.0]))
    return timing


def _check_trainer(config: Mapping[str, Any], transfer_queue: bool) -> None:
    """The manager class must be the one of verl's trainer: refused at create(), not at step 1."""
    use_v1 = (config.get("trainer") or {}).get("use_v1")
    if use_v1 is None or bool(use_v1) == transfer_queue:
        return
    wanted = "SpoolLoopManagerTQ" if use_v1 else "SpoolLoopManager"
    raise VerlConfigError(
        f"trainer.use_v1={str(bool(use_v1)).lower()} is verl's {'v1 (TransferQueue)' if use_v1 else 'legacy'} trainer: "
        f"set actor_rollout_ref.rollout.agent.agent_loop_manager_class=orchestrator.trainer.verl.{wanted}")


def _show_info_lines() -> None:
    """`import verl` sets the root logger to WARNING; the routes (once per data_source) are INFO lines:
    let this package's through, unless the user chose its level."""
    package = logging.getLogger("orchestrator.trainer.verl")
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)


def _empty_dicts(size: int) -> np.ndarray:
    array = np.empty(size, dtype=object)
    array[:] = [{} for _ in range(size)]
    return array


def _has_prompt(row: Mapping[str, Any] | None) -> bool:
    return row is not None and row.get("prompt_ids") is not None and len(row["prompt_ids"]) > 0


def _uses_rollout_log_probs(config: Mapping[str, Any]) -> bool:
    rollout = ((config.get("actor_rollout_ref") or {}).get("rollout") or {})
    correction = (config.get("algorithm") or {}).get("rollout_correction")
    return bool(rollout.get("calculate_log_probs")) or bool(correction)


def _plain(value: Any) -> Any:
    """numpy values of verl's non-tensor batch as JSON-able Python."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _open_spool(settings: ManagerSettings) -> Spool:
    """The run, with verl's custom reward function as its [rewards] setting: the function runs on our
    workers at EVAL, so run.toml names it (rows only select it). Workers read run.toml when they
    start: a change while some are alive is refused, naming the fix."""
    spool = Spool.create(settings.spool)
    custom = settings.custom_reward
    if custom is None:
        return spool
    wanted = custom.run_settings()
    current = spool.config.rewards
    if (current.verl_custom_path, current.verl_custom_name) == tuple(wanted.values()):
        return spool
    # The heartbeats' age on this node's clock: good enough to refuse (it errs towards asking).
    alive = [w.worker_id for w in read_workers(spool.paths, spool.config.leases.lease_s) if w.alive]
    if alive:
        raise VerlConfigError(
            f"reward=custom: run.toml [rewards] of {spool.paths.root} names {current.verl_custom_path or 'no function'}, "
            f"verl's config {custom.path} ({custom.name}), and {len(alive)} worker(s) already read run.toml: set it "
            f"first (hpc-rollout init {spool.paths.root} --set rewards.verl_custom_path={custom.path} --set "
            f"rewards.verl_custom_name={custom.name}), then start the workers")
    return Spool.create(settings.spool, **wanted)

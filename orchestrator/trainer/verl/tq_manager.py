"""`SpoolLoopManagerTQ`: the spool's rollouts for verl 0.9.1's v1 trainer (TransferQueue).

    trainer.use_v1=true
    actor_rollout_ref.rollout.agent.agent_loop_manager_class=orchestrator.trainer.verl.SpoolLoopManagerTQ
    +hpc_rollout.spool=/scratch/spool/run1                # the settings of SpoolLoopManager (settings.py)

verl's v1 contract (`TaskRunnerV1.init_agent_loop_manager`, `verl/trainer/ppo/v1/agent_loop_tq.py`):
`generate_sequences(TensorDict)` returns at once, with one row per prompt (its `uid`); each prompt's
rollout.n samples are put into TransferQueue under the keys `{uid}_{session}_0`, with the fields of
verl's `AgentLoopOutput.as_dict()` plus `input_ids`, `position_ids`, `loss_mask` and
`multi_modal_inputs`, unpadded, and tags whose `min_global_steps` / `max_global_steps` are the
policy versions that sampled them; then the prompt's tag `status` becomes `finished` (or
`failure`, which verl's replay buffer drops). verl's replay buffer picks whole groups up from there.

Each call runs SpoolLoopManager's step (the same submission, time limit, masking, assembly and
checks) on a thread of its own and puts its result into TransferQueue when it returns: the
trainer's thread is free at once, as the contract asks, and a batch lands whole. A group whose
samples were all masked (failed, cut by the time limit) is a `failure`; one with some usable
samples is `finished`, its masked samples carrying a zero response_mask, as in the legacy
trainer. A step that raises (every sample failed, a refused setting) marks its prompts `failure`,
is logged with its reason, and is raised again by the next call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from verl import DataProto                      # this module is imported only when verl is used
from verl.utils.ray_utils import auto_await

from orchestrator.trainer import verl_keys as keys
from orchestrator.trainer.verl.assemble import POLICY_VERSION, STATUS
from orchestrator.trainer.verl.manager import SpoolLoopManager

log = logging.getLogger(__name__)

RUNNING, FINISHED, FAILURE = "running", "finished", "failure"


class SpoolLoopManagerTQ(SpoolLoopManager):
    """SpoolLoopManager speaking verl's v1 (TransferQueue) contract; see the module doc."""

    TRANSFER_QUEUE = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import transfer_queue as tq

        tq.init()   # the client of the controller TaskRunnerV1 started (verl's own workers do the same)
        self._steps: list[threading.Thread] = []
        self._error: BaseException | None = None

    @classmethod
    @auto_await
    async def create(cls, *args: Any, **kwargs: Any) -> "SpoolLoopManagerTQ":
        manager = await SpoolLoopManager.create.__wrapped__(cls, *args, **kwargs)
        assert isinstance(manager, SpoolLoopManagerTQ)
        manager.warn_of_stale_backends()
        return manager

    def warn_of_stale_backends(self) -> None:
        """verl's v1 trainer syncs weights to its own servers only: say so for the others."""
        others = [b.url for b in self.registry.read().backends if b.url not in self.registered]
        if others:
            log.warning(
                "hpc-rollout: verl's v1 trainer updates the weights of its own rollout servers only (it builds "
                "its CheckpointEngineManager itself and reads no checkpoint_manager_class): %d backend(s) "
                "registered otherwise (%s) keep the weights they loaded; use +hpc_rollout.register_servers=true "
                "with verl's servers, or the legacy trainer with SpoolCheckpointManager (docs/trainer.md)",
                len(others), ", ".join(others[:3]))

    def generate_sequences(self, prompts: Any) -> None:
        """Submit the batch's prompts and return at once; their samples reach TransferQueue later."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        self._steps = [t for t in self._steps if t.is_alive()]
        validate = bool(_value(prompts, "validate", False))
        partition = "val" if validate else "train"
        uids = [str(u) for u in _column(prompts, keys.UID) or []]
        fields = [_row(prompts, i) for i in range(len(uids))]
        proto = self._repeated(prompts, validate)
        step = threading.Thread(target=self._run, args=(proto, uids, fields, partition),
                                name="hpc-rollout-tq-step", daemon=True)
        self._put_status(uids, partition, RUNNING)
        step.start()
        self._steps.append(step)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the steps submitted so far (a script's end, a test)."""
        for step in list(self._steps):
            step.join(timeout_s)

    def close(self) -> None:
        self.wait()
        super().close()

    # -- one step, on its thread -----------------------------------------------------------------
    def _run(self, proto: DataProto, uids: list[str], fields: list[dict[str, Any]], partition: str) -> None:
        try:
            output = self.generate(proto)
            self._put(output, uids, fields, partition)
        except BaseException as error:   # noqa: BLE001   kept for the next call; the prompts are failed
            log.error("hpc-rollout: a v1 rollout step failed: %s", error, exc_info=error)
            self._error = error
            self._put_status(uids, partition, FAILURE)

    def _repeated(self, prompts: Any, validate: bool) -> DataProto:
        """verl's v1 batch (one row per prompt) as the legacy batch SpoolLoopManager takes: each row
        repeated rollout.n times under its uid, the step in meta_info."""
        rollout = self.config.actor_rollout_ref.rollout
        n = int(rollout.val_kwargs.n if validate else rollout.n)
        columns: dict[str, np.ndarray] = {}
        for key in prompts.keys():
            values = _column(prompts, key)
            if values is not None:
                columns[key] = np.repeat(_objects(values), n)
        meta = {"global_steps": _value(prompts, "global_steps", None), "validate": validate}
        return DataProto(batch=None, non_tensor_batch=columns, meta_info=meta)

    def _put(self, output: DataProto, uids: list[str], fields: list[dict[str, Any]], partition: str) -> None:
        import transfer_queue as tq
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        n = len(output) // max(1, len(uids))
        statuses = output.non_tensor_batch[STATUS]
        put_keys, put_fields, tags, failed = [], [], [], []
        for group, uid in enumerate(uids):
            members = range(group * n, (group + 1) * n)
            if all(statuses[j] != "ok" for j in members):
                failed.append(uid)
                continue
            for session, j in enumerate(members):
                sample = _Sample(output, j)
                version = int(output.non_tensor_batch[POLICY_VERSION][j])
                result = AgentLoopOutput(
                    prompt_ids=sample.prompt, response_ids=sample.response, response_mask=sample.response_mask,
                    response_logprobs=sample.logprobs, reward_score=sample.reward,
                    num_turns=int(output.non_tensor_batch[keys.NUM_TURNS][j]), metrics=AgentLoopMetrics(),
                    extra_fields={"reward_extra_info": sample.extras(output.meta_info), "min_global_steps": version,
                                  "max_global_steps": version})
                entry = {**result.as_dict(), **fields[group], "session_id": session}
                entry.pop("validate", None)
                entry["input_ids"] = _int64(sample.prompt + sample.response)
                entry["position_ids"] = _int64(np.arange(len(entry["input_ids"])))
                entry["loss_mask"] = entry["response_mask"]
                entry["multi_modal_inputs"] = {}
                put_keys.append(f"{uid}_{session}_0")
                put_fields.append(entry)
                tags.append({"status": "success", "prompt_len": len(sample.prompt),
                             "response_len": len(sample.response),
                             "seq_len": len(sample.prompt) + len(sample.response),
                             "global_steps": fields[group].get("global_steps"),
                             "min_global_steps": version, "max_global_steps": version})
        if put_keys:
            tq.kv_batch_put(keys=put_keys, fields=list_of_dict_to_tensordict(put_fields), tags=tags,
                            partition_id=partition)
        self._put_status([u for u in uids if u not in failed], partition, FINISHED)
        if failed:
            log.warning("hpc-rollout: %d of %d prompt(s) had no usable sample: put as %s (verl drops them)",
                        len(failed), len(uids), FAILURE)
            self._put_status(failed, partition, FAILURE)

    @staticmethod
    def _put_status(uids: list[str], partition: str, status: str) -> None:
        import transfer_queue as tq

        if uids:
            tq.kv_batch_put(keys=uids, partition_id=partition, tags=[{"status": status} for _ in uids])


class _Sample:
    """One sample of the legacy (padded) batch, unpadded as verl's v1 stores it."""

    def __init__(self, output: DataProto, j: int) -> None:
        batch = output.batch
        width = batch[keys.PROMPTS].shape[1]
        attention = batch[keys.ATTENTION_MASK][j].numpy()
        length = int(attention[width:].sum())
        kept = max(1, length)   # a masked sample without a response keeps one pad token, mask 0: verl's
        #                         as_dict puts the reward on the last response token
        self.prompt = [int(t) for t in batch[keys.PROMPTS][j].numpy()[attention[:width].astype(bool)]]
        self.response = [int(t) for t in batch[keys.RESPONSES][j].numpy()[:kept]]
        self.response_mask = [int(m) for m in batch[keys.RESPONSE_MASK][j].numpy()[:kept]] if length else [0]
        self.reward = float(batch[keys.RM_SCORES][j].numpy()[:kept].sum())
        logprobs = batch[keys.ROLLOUT_LOG_PROBS] if keys.ROLLOUT_LOG_PROBS in batch.keys() else None
        self.logprobs = None if logprobs is None else [float(v) for v in logprobs[j].numpy()[:kept]]
        self._output, self._j = output, j

    def extras(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        columns = self._output.non_tensor_batch
        return {key: columns[key][self._j] for key in meta.get(keys.REWARD_EXTRA_KEYS, []) if key in columns}


def _column(batch: Any, key: str) -> list[Any] | None:
    """A per-row column of verl's TensorDict batch (tensors, NonTensorStack); None for a batch-wide value."""
    from tensordict import NonTensorData, NonTensorStack

    value = batch.get(key) if key in batch.keys() else None
    if value is None or isinstance(value, NonTensorData):
        return None
    if isinstance(value, NonTensorStack):
        return [item.data if hasattr(item, "data") else item for item in value]
    return list(value.tolist()) if hasattr(value, "tolist") else list(value)


def _value(batch: Any, key: str, default: Any) -> Any:
    """A batch-wide value of verl's TensorDict batch (NonTensorData), e.g. global_steps, validate."""
    from tensordict import NonTensorData

    if key not in batch.keys():
        return default
    value = batch.get(key)
    if isinstance(value, NonTensorData):
        return value.data
    return value if isinstance(value, (bool, int, str)) else default


def _row(batch: Any, i: int) -> dict[str, Any]:
    """The prompt's own fields, as verl's agent loop worker passes them on to TransferQueue."""
    from tensordict import NonTensorData, NonTensorStack

    row: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, NonTensorStack):
            row[key] = value[i].data
        elif isinstance(value, NonTensorData):
            row[key] = value.data
        else:
            row[key] = value[i]
    return row


def _objects(values: list[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _int64(values: Any) -> Any:
    import torch

    return torch.as_tensor(np.asarray(values, dtype=np.int64))

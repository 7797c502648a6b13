"""Each actor update of verl reaches every backend registered in the spool (`hpc-rollout backend add`).

    +actor_rollout_ref.rollout.checkpoint_manager_class=orchestrator.trainer.verl.checkpoint_hook.SpoolCheckpointManager
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.hpc_rollout.spool=/scratch/spool/run1

verl 0.9.1 calls its checkpoint manager's `update_weights(global_steps)` once before step 1 (step
0: the initial weights) and after every actor update (RayPPOTrainer.fit, and the v1 trainers);
`checkpoint_manager_class` replaces verl's CheckpointEngineManager by name. This one:

1. hands verl's own rollout servers, when verl started any, to verl's manager as before;
2. has verl's actor workers write their weights as a Hugging Face checkpoint (`model.safetensors`
   with the model's config and tokenizer files) under `dir` (default `<spool>/weights`), step by
   step: `step-<global_steps>/`, the last `keep` kept (a backend may still be loading the one
   before);
3. reloads it on every backend of the spool's registry through `swap_weights`, which moves the
   policy version to `global_steps` once all of them confirmed: rows sampled after it carry it.

Settings (`checkpoint_engine.engine_kwargs.hpc_rollout`, the only part of verl's config the
manager is given): `spool` (required), `dir`, `keep` (default 2), `max_policy_lag` (default
run.toml's [trainer] max_policy_lag). The directory must be readable by every backend (a shared
filesystem on a cluster). verl's own servers get their weights from verl: a registry that holds
them (`hpc_rollout.register_servers`) is refused here, since swap_weights reloads every entry.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.checkpoint_engine import CheckpointEngineManager   # imported only when verl loads this hook
from verl.utils.ray_utils import auto_await

from orchestrator.trainer.api import Spool
from orchestrator.trainer.verl.settings import VerlConfigError

log = logging.getLogger(__name__)

KWARGS_KEY = "hpc_rollout"
WHERE = f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{KWARGS_KEY}"
# What a server needs beside the weights to load a checkpoint directory (SGLang reads config.json).
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")


@dataclass(frozen=True)
class HookSettings:
    spool: Path
    directory: Path
    keep: int = 2
    max_policy_lag: int | None = None


def hook_settings(engine_kwargs: Mapping[str, Any] | None) -> HookSettings:
    """The hook's block of verl's checkpoint_engine.engine_kwargs, checked."""
    block = (engine_kwargs or {}).get(KWARGS_KEY)
    if not isinstance(block, Mapping) or not isinstance(block.get("spool"), str) or not block["spool"]:
        raise VerlConfigError(f"SpoolCheckpointManager needs the run directory: +{WHERE}.spool=RUN_DIR "
                              "(the same as hpc_rollout.spool)")
    unknown = sorted(set(block) - {"spool", "dir", "keep", "max_policy_lag"})
    if unknown:
        raise VerlConfigError(f"unknown key(s) {', '.join(f'{WHERE}.{k}' for k in unknown)}; "
                              "valid: spool, dir, keep, max_policy_lag")
    keep, lag = block.get("keep", 2), block.get("max_policy_lag")
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= 1000:
        raise VerlConfigError(f"{WHERE}.keep must be an integer in [1, 1000], got {keep!r}")
    if lag is not None and (isinstance(lag, bool) or not isinstance(lag, int) or lag < -1):
        raise VerlConfigError(f"{WHERE}.max_policy_lag must be an integer >= -1 (-1: none), got {lag!r}")
    spool = Path(block["spool"]).expanduser().absolute()
    directory = Path(block.get("dir") or spool / "weights").expanduser().absolute()
    return HookSettings(spool, directory, keep, lag)


class SpoolCheckpointManager(CheckpointEngineManager):
    """verl's CheckpointEngineManager, plus every update pushed to the spool's backends."""

    def __init__(self, config: Any, actor_wg: Any, replicas: list[Any]) -> None:
        super().__init__(config=config, actor_wg=actor_wg, replicas=replicas)
        self.settings = hook_settings(getattr(config, "engine_kwargs", None))
        self.spool = Spool.create(self.settings.spool)
        self.pushed: list[dict[str, Any]] = []   # one record per update: step, seconds, backends

    @auto_await
    async def update_weights(self, global_steps: int | None = None) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        if self.replicas:   # verl's own servers: verl's engine, as without the hook (its coroutine, unwrapped)
            metrics = await CheckpointEngineManager.update_weights.__wrapped__(self, global_steps) or {}
        if global_steps is None:   # a re-wake after validation (v1 trainer): the weights did not change
            return metrics
        metrics.update(await asyncio.to_thread(self.push, int(global_steps)))
        return metrics

    def push(self, step: int) -> dict[str, float]:
        """Write the actor's weights of `step` and reload them on every registered backend."""
        from orchestrator.trainer.verl.weights_export import export_weights

        backends = self.spool_backends()
        if not backends:
            log.warning("no backend registered in %s: the weights of step %d reach none", self.settings.spool, step)
            return {}
        started = time.monotonic()
        directory = self.settings.directory / f"step-{step}"
        export_weights(self.actor_wg, directory, MODEL_FILES)
        exported = time.monotonic() - started
        report = self.spool.swap_weights(directory, version=step, max_policy_lag=self.settings.max_policy_lag)
        self._prune(step)
        record = {"step": step, "export_s": round(exported, 3), "swap_s": round(report.seconds, 3),
                  "backends": list(report.reloaded), "removed": list(report.removed)}
        self.pushed.append(record)
        log.info("weights of step %d reloaded on %d backend(s) in %.2f s", step, len(report.reloaded),
                 time.monotonic() - started)
        return {"hpc_rollout/weights_export_s": exported, "hpc_rollout/weights_swap_s": report.seconds}

    def spool_backends(self) -> list[str]:
        """The registry's URLs; refused when it holds verl's own servers (verl updates those)."""
        from orchestrator.llm.registry import BackendRegistry

        urls = [b.url for b in BackendRegistry.of(self.spool.paths).read().backends]
        verl_servers = {f"http://{getattr(r, '_server_address', '')}/v1" for r in self.replicas}
        both = sorted(verl_servers & set(urls))
        if both:
            raise VerlConfigError(
                f"the registry of {self.settings.spool} holds verl's own rollout server(s) {', '.join(both)}: verl "
                "updates their weights itself and swap_weights would reload them too; set "
                "+hpc_rollout.register_servers=false, or leave checkpoint_manager_class unset")
        return urls

    def _prune(self, step: int) -> None:
        steps = sorted((int(p.name.split("-", 1)[1]), p) for p in self.settings.directory.glob("step-*")
                       if p.name.split("-", 1)[1].isdigit())
        for old, path in steps[:-self.settings.keep]:
            if old != step:
                shutil.rmtree(path, ignore_errors=True)

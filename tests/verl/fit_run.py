"""verl 0.9.1's own trainer, run as `main_ppo` runs it, on the spool's rollouts (inside verl's venv).

    python -m tests.verl.fit_run ARGS.json     # prints {"seconds": ...} as its last line

What main_ppo does, with verl's own code: hydra over verl's ppo_trainer.yaml with the overrides
given (the config of docs/trainer.md), `validate_config`, the tokenizer of `HFModelConfig`,
`create_rl_dataset` (RLHFDataset) and `create_rl_sampler` on a verl-format parquet, TaskRunner's
worker mapping and resource pool (`BaseTaskRunner`), `RayPPOTrainer(...)`, then `fit()`:
the legacy trainer (`trainer.use_v1=false`), or verl's v1 trainer (`trainer.use_v1=true`, TransferQueue)
run by verl's own `TaskRunnerV1.run` (`v1_fit`). Metrics go to verl's own `file` logger (VERL_FILE_LOGGER_PATH, one JSON line per step).

`init_workers` is verl's, less what needs a GPU (tests/verl/cpu_patches.py lists the patches
that make the rest run on CPU): verl's vLLM rollout engine and servers do not exist here, so the
actor worker (verl's real ActorRolloutRefWorker with its FSDP engine, in a Ray worker of verl's
RayWorkerGroup) is built with role "actor" (no rollout engine), verl's LLMServerManager is not
started (`llm_client` None: the spool's registered backends serve) and no reward loop workers
are started (rm_scores come with the batch, so fit() never calls them). The rollout manager and
the checkpoint manager are loaded from the config by name, as init_workers loads them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.verl import cpu_patches

PATCH_HOOK = "tests.verl.cpu_patches.apply"


def compose(overrides: list[str]) -> Any:
    import verl
    from hydra import compose as hydra_compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def start_ray(config: Any) -> None:
    """Ray as main_ppo starts it (verl's runtime env), plus the CPU patches in every worker."""
    import ray
    from omegaconf import OmegaConf

    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    runtime_env = OmegaConf.to_container(OmegaConf.create(get_ppo_ray_runtime_env(config)))
    runtime_env["worker_process_setup_hook"] = PATCH_HOOK
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True, runtime_env=runtime_env)


def init_workers_on_cpu(trainer: Any) -> None:
    """RayPPOTrainer.init_workers less what needs a GPU (see the module doc)."""
    from verl.single_controller.ray.base import RayClassWithInitArgs, create_colocated_worker_cls
    from verl.trainer.ppo.ray_trainer import Role
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import load_class_from_fqn

    config = trainer.config
    trainer.resource_pool_manager.create_resource_pool()
    role = Role.ActorRollout
    pool = trainer.resource_pool_manager.get_resource_pool(role)
    actor = RayClassWithInitArgs(cls=trainer.role_worker_mapping[role], config=config.actor_rollout_ref,
                                 distillation_config=config.get("distillation"), role="actor")
    group = trainer.ray_worker_group_cls(resource_pool=pool,
                                         ray_cls_with_init=create_colocated_worker_cls(class_dict={str(role): actor}),
                                         device_name=trainer.device_name)
    trainer.actor_rollout_wg = group.spawn(prefix_set={str(role)})[str(role)]
    trainer.actor_rollout_wg.init_model()
    trainer.async_rollout_mode = True
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    manager_class = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class,
                                        "AgentLoopManager")
    trainer.async_rollout_manager = manager_class.create(config=config, llm_client=None, teacher_client=None,
                                                         reward_loop_worker_handles=None)
    checkpoint_class = load_class_from_fqn(config.actor_rollout_ref.rollout.checkpoint_manager_class,
                                           "CheckpointEngineManager")
    trainer.checkpoint_manager = checkpoint_class(
        config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine),
        actor_wg=trainer.actor_rollout_wg, replicas=[])
    trainer.checkpoint_manager.sleep_replicas()


def legacy_trainer(config: Any) -> Any:
    """What main_ppo_v0.TaskRunner.run does up to init_workers, with verl's own functions."""
    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.dataset.rl_dataset import collate_fn

    runner = BaseTaskRunner()
    _, group_class = runner.add_actor_rollout_worker(config)
    runner.add_critic_worker(config)
    runner.add_reward_model_resource_pool(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer, processor = model_config.tokenizer, model_config.processor
    pools = runner.init_resource_pool_mgr(config)
    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, is_train=True,
                              max_samples=config.data.get("train_max_samples", -1))
    val = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, is_train=False,
                            max_samples=config.data.get("val_max_samples", -1))
    return RayPPOTrainer(config=config, tokenizer=tokenizer, processor=processor,
                         role_worker_mapping=runner.role_worker_mapping, resource_pool_manager=pools,
                         ray_worker_group_cls=group_class, train_dataset=train, val_dataset=val,
                         collate_fn=collate_fn, train_sampler=create_rl_sampler(config.data, train))


def v1_fit(config: Any) -> list[dict[str, Any]]:
    """verl's own TaskRunnerV1.run (TransferQueue, the v1 sync trainer, init(), fit()), less what needs a
    GPU: verl's colocated vLLM replicas, which its v1 trainers leave out with `_enable_hybrid_replicas =
    False` (its separate_async trainer does so); the weight sync to those replicas is then the spool's
    hook, SpoolCheckpointManager, in place of verl's CheckpointEngineManager (both patches: cpu_patches.py
    7 and 8). The hook's record of pushes is returned."""
    import verl.trainer.ppo.v1 as v1
    import verl.trainer.ppo.v1.trainer_base as trainer_base
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.utils.config import validate_config
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    from orchestrator.trainer.verl.checkpoint_hook import SpoolCheckpointManager

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    cpu_patches.no_rollout_replicas(v1)
    trainer_base.CheckpointEngineManager = SpoolCheckpointManager
    # main_ppo runs TaskRunnerV1 as a Ray actor; here its class runs in the driver, where patches 7-8 are.
    runner = TaskRunnerV1.__ray_actor_class__()
    try:
        runner.run(config)
    finally:
        if runner.agent_loop_manager is not None:
            runner.agent_loop_manager.close()
    return runner.trainer.checkpoint_manager.pushed


def grpo_of_rows(run_dir: str, n: int, response_length: int) -> list[dict[str, float]]:
    """verl's compute_grpo_outcome_advantage on the spool's rows, one figure set per submission of
    groups of rollout.n samples (= per step; not the manager's warm-up): what fit() must have
    computed from the batch the manager handed it."""
    import numpy as np
    import pyarrow.dataset as ds
    import torch

    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rows = [r for r in ds.dataset(Path(run_dir) / "shards", format="parquet").to_table(
        columns=["job_id", "group_id", "group_size", "reward", "response_mask"]).to_pylist()
        if r["group_size"] == n]
    figures = []
    for submission in sorted({r["group_id"].rsplit("-", 1)[0] for r in rows}):
        mine = sorted((r for r in rows if r["group_id"].startswith(submission)), key=lambda r: r["job_id"])
        mask = torch.zeros(len(mine), response_length)
        rewards = torch.zeros(len(mine), response_length)
        for i, row in enumerate(mine):
            length = min(len(row["response_mask"]), response_length)
            mask[i, :length] = torch.tensor(list(row["response_mask"])[:length], dtype=torch.float32)
            rewards[i, length - 1] = float(row["reward"])
        advantages, _ = compute_grpo_outcome_advantage(rewards, mask, np.array([r["group_id"] for r in mine]))
        valid = advantages[mask.bool()]
        figures.append({"mean": float(valid.mean()), "max": float(valid.max()), "min": float(valid.min())})
    return figures


def run(args: dict[str, Any]) -> dict[str, Any]:
    import ray
    from omegaconf import OmegaConf

    from verl.utils.device import auto_set_device

    started = time.monotonic()
    cpu_patches.apply()
    config = compose(args["overrides"])
    auto_set_device(config)
    start_ray(config)
    try:
        if config.trainer.use_v1:
            pushed = v1_fit(config)
        else:
            OmegaConf.resolve(config)
            trainer = legacy_trainer(config)
            init_workers_on_cpu(trainer)
            trainer.fit()
            trainer.async_rollout_manager.close()
            pushed = trainer.checkpoint_manager.pushed
    finally:
        ray.shutdown()
    return {"seconds": round(time.monotonic() - started, 1), "pushed": pushed,
            "grpo": grpo_of_rows(args["run"], int(config.actor_rollout_ref.rollout.n),
                                 int(config.actor_rollout_ref.rollout.response_length))}


if __name__ == "__main__":
    arguments = json.loads(Path(sys.argv[1]).read_text())
    os.environ.setdefault("VERL_FILE_LOGGER_PATH", arguments["metrics"])
    print(json.dumps(run(arguments)))

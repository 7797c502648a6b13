"""Run inside verl's venv (tests/verl/env.py) for tests/verl/test_silent.py: verl's own code around
the manager's failure metrics, its settings map and its overlong penalty.

    python -m tests.verl.silent_run ARGS.json     # prints {scenario: figures} as the last line

- settings: verl's ppo_trainer.yaml composed by hydra, at its defaults and with each setting of
  verl_config.py changed; parse_settings' answer for each, and for the legacy keys also its answer
  on the config after verl's own `migrate_legacy_reward_impl` (the two must agree).
- overlong: a batch assembled with the overlong penalty, against verl's DAPORewardManager.run_single
  on the same batch.
- validate: verl's real `RayPPOTrainer._validate` (on an instance that skips __init__: the dataloader,
  tokenizer, config and manager it reads are set, as init_workers would set them) over math rows
  whose grader is missing on the worker, rows naming a verl agent loop, then math + gsm8k rows; and the training path's
  `compute_timing_metrics` over the manager's meta_info["timing"], as fit() feeds it.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

FQN = "orchestrator.trainer.verl.SpoolLoopManager"
DAPO = ["+reward.reward_kwargs.max_resp_len=64", "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
        "+reward.reward_kwargs.overlong_buffer_cfg.len=16",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward.reward_kwargs.overlong_buffer_cfg.log=true"]
CASES: dict[str, list[str]] = {
    "default": [],
    "custom": ["reward.custom_reward_function.path={custom}"],
    "custom_legacy": ["custom_reward_function.path={custom}"],
    "custom_but_handler": ["reward.custom_reward_function.path={custom}", "+hpc_rollout.reward=handler"],
    "reward_model": ["reward.reward_model.enable=true"],
    "reward_model_legacy": ["reward_model.enable=true"],
    "manager_gdpo": ["reward.reward_manager.name=gdpo"],
    "manager_legacy_remote": ["reward_model.reward_manager=remote"],
    "manager_importlib": ["reward.reward_manager.source=importlib", "reward.reward_manager.module.path=/x/m.py"],
    "dapo": ["reward.reward_manager.name=dapo", *DAPO],
    "dapo_legacy": ["reward_model.reward_manager=dapo", *(o.replace("+reward.", "+reward_model.") for o in DAPO)],
    "overlong_without_dapo": DAPO,
    "sandbox_fusion": ["reward.sandbox_fusion.url=http://fusion:8080"],
    "agent_loop": ["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"],
    "agent_loop_config": ["actor_rollout_ref.rollout.agent.agent_loop_config_path=/cfg/loops.yaml"],
    "tools": ["actor_rollout_ref.rollout.multi_turn.tool_config_path=/cfg/tools.yaml"],
    "function_tools": ["actor_rollout_ref.rollout.multi_turn.function_tool_path=/cfg/tools.py"],
    "interaction": ["+actor_rollout_ref.rollout.multi_turn.interaction_config_path=/cfg/interaction.yaml"],
}


def compose(overrides: list[str]) -> Any:
    import verl
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def parsed(config: Any) -> dict[str, Any]:
    from orchestrator.trainer.verl.settings import VerlConfigError, parse_settings

    try:
        settings = parse_settings(config)
    except VerlConfigError as exc:
        return {"refused": str(exc)}
    overlong = getattr(settings, "overlong", None)    # absent before the penalty was applied: read as none
    return {"reward": settings.reward.value, "custom": settings.custom_reward and settings.custom_reward.path,
            "overlong": overlong and asdict(overlong)}


def settings_map(args: dict[str, Any]) -> dict[str, Any]:
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    base = [f"+hpc_rollout.spool={args['run']}", f"actor_rollout_ref.model.path={args['model']}"]
    out: dict[str, Any] = {}
    for name, overrides in CASES.items():
        config = compose(base + [o.format(custom=args["custom"]) for o in overrides])
        out[name] = parsed(config)
        if "legacy" in name:    # verl's own mapping of its legacy keys gives the same answer
            out[name]["after_verls_migration"] = parsed(migrate_legacy_reward_impl(copy.deepcopy(config)))
    return out


def overlong(args: dict[str, Any]) -> dict[str, Any]:
    import torch
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager
    from verl.utils import hf_tokenizer

    from orchestrator.trainer.verl.assemble import assemble
    from orchestrator.trainer.verl.verl_config import Overlong

    cfg = {"enable": True, "len": 8, "penalty_factor": 1.5, "log": True}
    penalty = Overlong(max_response_length=16, buffer=8, penalty_factor=1.5, log=True)
    # (sampled tokens, observation tokens, score): lengths around the buffer's start (8) and the limit (16)
    shapes = [(4, 0, 1.0), (8, 0, 0.0), (9, 0, 1.0), (6, 5, 0.3), (13, 0, 1.0), (16, 0, 0.7), (20, 0, 1.0), (3, 7, 0.1)]
    slots = []
    for i, (sampled, observed, score) in enumerate(shapes):
        mask = [1] * sampled + [0] * observed
        slots.append({"job_id": f"j{i}", "status": "ok", "reward": score, "prompt_ids": np.array([1, 2]),
                      "response_ids": np.arange(len(mask)) + 100, "response_mask": np.array(mask)})
    ours = assemble(slots, [f"u{i}" for i in range(len(slots))], [[1]] * len(slots), 4, 16, overlong=penalty)
    batch = DataProto(
        batch=TensorDict({k: torch.from_numpy(v) for k, v in ours.tensors.items()}, batch_size=len(slots)),
        non_tensor_batch={"data_source": np.array(["math"] * len(slots), dtype=object),
                          "reward_model": np.array([{"ground_truth": "1"}] * len(slots), dtype=object),
                          "extra_info": np.array([{"index": i} for i in range(len(slots))], dtype=object)})

    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any],
                      **_: Any) -> float:
        return shapes[extra_info["index"]][2]

    manager = DAPORewardManager(OmegaConf.create({"reward": {"reward_kwargs": {"max_resp_len": 16,
                                                                               "overlong_buffer_cfg": cfg}}}),
                                hf_tokenizer(args["model"]), compute_score)
    verls = [manager.loop.run_until_complete(manager.run_single(batch[i:i + 1])) for i in range(len(slots))]
    return {"ours": ours.tensors["rm_scores"].sum(axis=1).tolist(),
            "verl": [float(np.float32(torch.as_tensor(v["reward_score"]).item())) for v in verls],
            "ours_extra": {k: ours.non_tensors[k].tolist() for k in ("overlong_reward", "overlong")},
            "verl_extra": {k: [float(torch.as_tensor(v["reward_extra_info"][k]).item()) for v in verls]
                           for k in ("overlong_reward", "overlong")}}


def validate(args: dict[str, Any]) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from verl import DataProto
    from verl.trainer.ppo.metric_utils import compute_timing_metrics
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.import_utils import load_class_from_fqn

    def config_for(parquet: str) -> Any:
        rollout = "actor_rollout_ref.rollout"
        return compose([f"actor_rollout_ref.model.path={args['model']}", f"{rollout}.n=2",
                        f"{rollout}.prompt_length=256", f"{rollout}.response_length=32",
                        f"+{rollout}.agent.agent_loop_manager_class={FQN}", f"{rollout}.agent.num_workers=1",
                        f"data.train_files={parquet}", f"data.val_files={parquet}", "data.max_prompt_length=256",
                        "data.max_response_length=32", "trainer.use_v1=false", f"+hpc_rollout.spool={args['run']}",
                        "+hpc_rollout.handler=answer", "+hpc_rollout.poll_s=0.05"])

    def trainer_for(parquet: str) -> Any:
        config = config_for(parquet)
        tokenizer = hf_tokenizer(args["model"])
        dataset = RLHFDataset(data_files=[parquet], tokenizer=tokenizer, config=config.data)
        trainer = RayPPOTrainer.__new__(RayPPOTrainer)     # verl's methods, the attributes _validate reads
        trainer.config, trainer.tokenizer, trainer.use_rm, trainer.global_steps = config, tokenizer, False, 0
        trainer.val_dataloader = DataLoader(dataset, batch_size=len(dataset), shuffle=False, collate_fn=collate_fn)
        trainer.async_rollout_manager = load_class_from_fqn(FQN, "AgentLoopManager").create(
            config=config, llm_client=None, teacher_client=None, reward_loop_worker_handles=None)
        return trainer

    out: dict[str, Any] = {}
    try:
        trainer_for(args["math_rows"])._validate()
        out["all_failed"] = {"returned": True}
    except Exception as exc:   # what verl's _validate lets through
        out["all_failed"] = {"error": type(exc).__name__, "message": str(exc)}
    try:       # a dataset whose rows name one of verl's agent loops (verl's tool datasets carry agent_name)
        trainer_for(args["agent_rows"])._validate()
        out["agent_rows"] = {"returned": True}
    except Exception as exc:
        out["agent_rows"] = {"error": type(exc).__name__, "message": str(exc)}
    trainer = trainer_for(args["mixed_rows"])
    out["validation_metrics"] = {k: float(v) for k, v in trainer._validate().items()}
    # a training step's path: fit() merges meta_info["timing"] into timing_raw, compute_timing_metrics logs it
    batch = DataProto.from_single_dict(next(iter(trainer.val_dataloader)))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    gen = trainer._get_gen_batch(batch).repeat(repeat_times=2, interleave=True)
    gen.meta_info["global_steps"] = 1
    output = trainer.async_rollout_manager.generate_sequences(gen)
    timing_raw = {"gen": 1.0, **output.meta_info["timing"]}
    out["training_metrics"] = {k: float(v) for k, v in compute_timing_metrics(output, timing_raw).items()
                               if "hpc_rollout" in k}
    out["hpc_rollout_meta"] = output.meta_info["hpc_rollout"]
    return out


def main() -> None:
    args = json.loads(Path(sys.argv[1]).read_text())
    results: dict[str, Any] = {}
    for name, run in (("settings", settings_map), ("overlong", overlong), ("validate", validate)):
        try:
            results[name] = run(args)
        except Exception as exc:   # the caller sees which scenario broke and where
            results[name] = {"crashed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()

"""verl's input batch into SpoolLoopManager and what comes back (inside verl's venv): no copy of fit().

    python -m tests.verl.manager_calls ARGS.json   # {"scenarios": [...]}; prints {name: figures} last

For what verl's real `fit()` cannot reach in a test's time (a refusal, a scripted multi-turn tool
task, verl's own server client, a time limit): the batch as verl builds it (its config composed
from ppo_trainer.yaml, RLHFDataset + collate_fn, uid, `RayPPOTrainer._get_gen_batch`, repeat(n)),
the manager loaded with load_class_from_fqn and built with create(), one generate_sequences; the
result read as it is and through verl's own functions only: compute_response_mask,
compute_grpo_outcome_advantage, agg_loss. What fit() does with the batch is tests/verl/test_fit.py's.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

FQN = "orchestrator.trainer.verl.SpoolLoopManager"


def compose(args: dict[str, Any]) -> Any:
    import verl
    from hydra import compose as hydra_compose, initialize_config_dir

    rollout = "actor_rollout_ref.rollout"
    overrides = [
        f"actor_rollout_ref.model.path={args['model']}",
        f"{rollout}.n={args['n']}",
        f"{rollout}.prompt_length={args['prompt_length']}",
        f"{rollout}.response_length={args['response_length']}",
        f"{rollout}.temperature={args['temperature']}",
        f"{rollout}.calculate_log_probs={args.get('calculate_log_probs', True)}",
        f"{rollout}.logprobs_mode={args.get('logprobs_mode', 'processed_logprobs')}",
        f"+{rollout}.agent.agent_loop_manager_class={FQN}",   # not in ppo_trainer.yaml: added
        f"data.train_files={args['parquet']}",
        f"data.max_prompt_length={args['prompt_length']}",
        f"data.max_response_length={args['response_length']}",
        "algorithm.adv_estimator=grpo",
        f"data.train_batch_size={args['prompts']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args['prompts']}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        f"trainer.use_v1={str(args.get('use_v1', False)).lower()}",
        f"+hpc_rollout.spool={args['run']}",
        f"+hpc_rollout.reward={args.get('reward', 'handler')}",
        "+hpc_rollout.poll_s=0.05",
    ]
    if args.get("handler"):
        overrides.append(f"+hpc_rollout.handler={args['handler']}")
    if args.get("time_limit_s") is not None:
        overrides.append(f"+hpc_rollout.time_limit_s={args['time_limit_s']}")
    if args.get("warm_up_s") is not None:
        overrides.append(f"+hpc_rollout.warm_up_s={args['warm_up_s']}")
    if args.get("custom_reward"):
        overrides += [f"reward.custom_reward_function.path={args['custom_reward']}",
                      "reward.custom_reward_function.name=compute_score"]
    if args.get("max_policy_lag") is not None:
        overrides.append(f"+hpc_rollout.max_policy_lag={args['max_policy_lag']}")
    if args.get("max_tokens"):
        overrides.append(f"+hpc_rollout.sampling={{max_tokens:{args['max_tokens']}}}")
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def input_batch(config: Any, tokenizer: Any, size: int) -> Any:
    from torch.utils.data import DataLoader

    from verl import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    dataset = RLHFDataset(data_files=[config.data.train_files], tokenizer=tokenizer, config=config.data)
    batch_dict = next(iter(DataLoader(dataset, batch_size=size, shuffle=False, collate_fn=collate_fn)))
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    return batch


def verl_servers_client(config: Any, addresses: list[str]) -> Any:
    """verl's own LLMServerClient over verl's own load balancer (a Ray actor), as LLMServerManager
    builds them, for servers verl did not start (no GPU here): serve-llm's "host:port"."""
    import ray

    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    handle = get_router_handle(servers={address: None for address in addresses})
    return LLMServerClient(config=config, load_balancer_handle=handle)


def run(args: dict[str, Any]) -> dict[str, Any]:
    from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask
    from verl.utils import hf_tokenizer
    from verl.utils.import_utils import load_class_from_fqn

    config = compose(args)
    tokenizer = hf_tokenizer(args["model"])
    n = int(args["n"])
    batch = input_batch(config, tokenizer, int(args["prompts"]))
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)       # verl's own
    gen_batch.meta_info["global_steps"] = int(args.get("global_steps", 1))
    gen_batch_output = gen_batch.repeat(repeat_times=n, interleave=True)

    manager_class = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class,
                                        "AgentLoopManager")
    llm_client = verl_servers_client(config, args["verl_servers"]) if args.get("verl_servers") else None
    manager = manager_class.create(config=config, llm_client=llm_client, teacher_client=None,
                                   reward_loop_worker_handles=None)
    output = manager.generate_sequences(gen_batch_output)
    timing = output.meta_info["timing"]
    tensors = output.batch
    mask = tensors["response_mask"]
    attention_of_response = compute_response_mask(output)                 # verl's rule, from the attention
    uids = output.non_tensor_batch["uid"]
    rewards = tensors["rm_scores"]
    advantages, _ = compute_grpo_outcome_advantage(rewards, mask, uids)
    loss = agg_loss(loss_mat=-advantages, loss_mask=mask, loss_agg_mode="token-mean")
    extra_keys = list(output.meta_info.get("reward_extra_keys") or [])
    repeated = batch.repeat(repeat_times=n, interleave=True)
    return {
        "samples": len(output),
        "uids_in_order": [str(u) for u in uids] == [str(u) for u in gen_batch_output.non_tensor_batch["uid"]],
        "statuses": output.non_tensor_batch["hpc_rollout_status"].tolist(),
        "versions": output.non_tensor_batch["hpc_rollout_policy_version"].tolist(),
        "num_turns": output.non_tensor_batch["__num_turns__"].tolist(),
        "multi_modal_inputs": [dict(m) for m in output.non_tensor_batch["multi_modal_inputs"]],
        "counts": dict(output.meta_info["hpc_rollout"]),
        "timing_keys": sorted(timing),
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
        "mask_outside_attention": int((mask.bool() & ~attention_of_response.bool()).sum()),
        "masked_tokens_per_sample": mask.sum(-1).tolist(),
        "observation_tokens": int(((attention_of_response == 1) & (mask == 0)).sum()),
        "rewards": rewards.sum(-1).tolist(),
        "reward_extra_keys": sorted(extra_keys),
        "advantages_finite": bool(torch.isfinite(advantages).all()),
        "policy_loss_finite": bool(torch.isfinite(loss)),
        "ground_truths": [str(rm["ground_truth"]) for rm in repeated.non_tensor_batch["reward_model"]],
        "registry": json.loads(registry.read_text()) if (registry := Path(args["run"]) / "backends.json").exists() else None,
    }


def score_table(args: dict[str, Any]) -> dict[str, Any]:
    """verl's gsm8k scorer, directly and through default_compute_score, on (reply, truth) pairs."""
    from verl.utils.reward_score import default_compute_score, gsm8k

    table = args["table"]
    return {"gsm8k": [gsm8k.compute_score(reply, truth) for reply, truth in table],
            "default": [default_compute_score("openai/gsm8k", reply, truth) for reply, truth in table]}


def v1_batch(args: dict[str, Any]) -> dict[str, Any]:
    """verl 0.9.1's V1 trainer hands its manager a TensorDict: refused, naming the manager of that
    trainer; with trainer.use_v1=true in the config, refused at create() already."""
    from tensordict import TensorDict

    from verl.utils.import_utils import load_class_from_fqn

    try:
        load_class_from_fqn(FQN, "AgentLoopManager").create(config=compose({**args, "use_v1": True}))
        at_create = ""
    except Exception as exc:   # noqa: BLE001   what the test checks
        at_create = f"{type(exc).__name__}: {exc}"
    manager = load_class_from_fqn(FQN, "AgentLoopManager").create(config=compose(args))
    try:
        manager.generate_sequences(TensorDict({"dummy_tensor": torch.zeros(2, 1)}, batch_size=2))
        at_call = ""
    except Exception as exc:   # noqa: BLE001   what the test checks
        at_call = f"{type(exc).__name__}: {exc}"
    return {"at_create": at_create or "(accepted)", "at_call": at_call or "(accepted)"}


def run_all(scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    """Every scenario in this one process (verl's imports take half a minute on a busy machine)."""
    import traceback

    results: dict[str, Any] = {}
    for scenario in scenarios:
        started = time.monotonic()
        try:
            kind = score_table if "table" in scenario else v1_batch if scenario.get("v1") else run
            results[scenario["name"]] = kind(scenario)
        except Exception as exc:   # reported to the test, which decides whether it was expected
            results[scenario["name"]] = {"error": type(exc).__name__, "message": str(exc),
                                         "traceback": traceback.format_exc()[-4000:]}
        results[scenario["name"]]["driver_seconds"] = round(time.monotonic() - started, 2)
    return results


if __name__ == "__main__":
    arguments = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps(run_all(arguments["scenarios"])))

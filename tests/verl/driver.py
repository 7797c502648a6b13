"""Run inside verl's venv (tests/verl/env.py): verl's own code around SpoolLoopManager.

    python -m tests.verl.driver ARGS.json   # {"scenarios": [...]}; prints {name: figures} as the last line

What RayPPOTrainer does around its rollout manager, with verl's own functions: the config composed
from verl's ppo_trainer.yaml; the batch from a verl-format parquet through RLHFDataset + collate_fn;
uid, _get_gen_batch and repeat(n) as fit() does; the manager loaded with load_class_from_fqn and
built with create(); generate_sequences; then union with the repeated batch, extract_reward, a
recomputed old_log_probs (the tiny model itself, logits / temperature as verl's actor does)
merged with DataProto.union, compute_advantage (GRPO), the vanilla policy loss and agg_loss in
every mode, and compute_response_mask against our response_mask. Assertions that verl's own
code would make fail here as exceptions (the caller sees the traceback); figures go to the JSON.
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
        "trainer.use_v1=false",
        f"+hpc_rollout.spool={args['run']}",
        f"+hpc_rollout.reward={args.get('reward', 'handler')}",
        "+hpc_rollout.poll_s=0.05",
    ]
    if args.get("handler"):
        overrides.append(f"+hpc_rollout.handler={args['handler']}")
    if args.get("time_limit_s") is not None:
        overrides.append(f"+hpc_rollout.time_limit_s={args['time_limit_s']}")
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


def recomputed_log_probs(model_dir: str, batch: Any, temperature: float) -> torch.Tensor:
    """log p(response token) under the tiny model, logits / temperature (verl's actor does the same)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    prompt_width = batch.batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                       position_ids=batch.batch["position_ids"]).logits
    logits = logits[:, prompt_width - 1:-1, :].float() / temperature
    picked = batch.batch["responses"].unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, picked).squeeze(-1)


def verl_servers_client(config: Any, addresses: list[str]) -> Any:
    """verl's own LLMServerClient over verl's own load balancer (a Ray actor), as LLMServerManager
    builds them, for servers verl did not start (no GPU here): serve-llm's "host:port"."""
    import ray

    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    handle = get_router_handle(servers={address: None for address in addresses})
    return LLMServerClient(config=config, load_balancer_handle=handle)


def actor_config(config: Any) -> Any:
    """verl's ActorConfig dataclass (what its actor hands the policy loss), from the composed config."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)   # global_batch_info {}: one process


def run(args: dict[str, Any]) -> dict[str, Any]:
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.core_algos import AdvantageEstimator, agg_loss
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask
    from verl.trainer.ppo.reward import extract_reward
    from verl.utils import hf_tokenizer
    from verl.utils.import_utils import load_class_from_fqn

    config = compose(args)
    tokenizer = hf_tokenizer(args["model"])
    n = int(args["n"])
    batch = input_batch(config, tokenizer, int(args["prompts"]))
    batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)       # verl's own, as fit() calls it
    gen_batch.meta_info["global_steps"] = int(args.get("global_steps", 1))
    gen_batch_output = gen_batch.repeat(repeat_times=n, interleave=True)

    manager_class = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class,
                                        "AgentLoopManager")
    llm_client = verl_servers_client(config, args["verl_servers"]) if args.get("verl_servers") else None
    manager = manager_class.create(config=config, llm_client=llm_client, teacher_client=None,
                                   reward_loop_worker_handles=None)
    output = manager.generate_sequences(gen_batch_output)
    timing = output.meta_info.pop("timing")
    ours = dict(output.meta_info["hpc_rollout"])
    uids_in = [str(u) for u in gen_batch_output.non_tensor_batch["uid"]]

    batch = batch.repeat(repeat_times=n, interleave=True)
    batch = batch.union(output)                                       # RayPPOTrainer.fit's own union
    if "response_mask" not in batch.batch.keys():
        batch.batch["response_mask"] = compute_response_mask(batch)
    attention_of_response = compute_response_mask(batch)
    mask = batch.batch["response_mask"]
    reward_tensor, reward_extra = extract_reward(batch)

    old_log_probs = recomputed_log_probs(args["model"], batch, float(args["temperature"]))
    batch = batch.union(DataProto.from_dict(tensors={"old_log_probs": old_log_probs}))   # must not assert
    batch.batch["token_level_scores"] = reward_tensor
    batch.batch["token_level_rewards"] = reward_tensor
    batch = compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=n,
                              norm_adv_by_std_in_grpo=True, config=config.algorithm)

    # the same advantages by hand, per uid (unbiased std, as verl)
    scores = reward_tensor.sum(-1)
    expected = torch.zeros_like(scores)
    for uid in set(uids_in):
        members = [i for i, u in enumerate(uids_in) if u == uid]
        group = scores[members]
        mean, std = (group.mean(), group.std()) if len(members) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        expected[members] = (group - mean) / (std + 1e-6)
    advantage_error = float(((batch.batch["advantages"] - expected.unsqueeze(-1) * mask).abs()).max())

    policy_loss = core_algos.get_policy_loss_fn("vanilla")
    log_prob = old_log_probs + 0.01 * mask          # a step of "new" logprobs: ratio != 1 on sampled tokens
    loss, loss_metrics = policy_loss(old_log_prob=batch.batch["old_log_probs"], log_prob=log_prob,
                                     advantages=batch.batch["advantages"], response_mask=mask,
                                     loss_agg_mode="token-mean", config=actor_config(config))
    aggregates = {mode: float(agg_loss(loss_mat=-batch.batch["advantages"] * log_prob, loss_mask=mask,
                                       loss_agg_mode=mode))
                  for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")}

    responses = batch.batch["responses"]
    width = responses.shape[1]
    texts = [tokenizer.decode(responses[i][: int(attention_of_response[i].sum())], skip_special_tokens=True)
             for i in range(len(batch))]
    gold = [str(rm["ground_truth"]) for rm in batch.non_tensor_batch["reward_model"]]
    sampled = mask.bool()
    rollout = batch.batch.get("rollout_log_probs") if "rollout_log_probs" in batch.batch.keys() else None
    return {
        "samples": len(batch),
        "prompts": int(args["prompts"]),
        "uids_in_order": [str(u) for u in batch.non_tensor_batch["uid"]] == uids_in,
        "job_ids": [j for j in output.non_tensor_batch["hpc_rollout_job_id"].tolist()],
        "statuses": output.non_tensor_batch["hpc_rollout_status"].tolist(),
        "versions": output.non_tensor_batch["hpc_rollout_policy_version"].tolist(),
        "num_turns": output.non_tensor_batch["__num_turns__"].tolist(),
        "counts": ours,
        "timing_keys": sorted(timing),
        "timing": {k: float(v) for k, v in timing.items()},
        "shapes": {k: list(v.shape) for k, v in output.batch.items()},
        "mask_outside_attention": int((mask.bool() & ~attention_of_response.bool()).sum()),
        "masked_tokens_per_sample": mask.sum(-1).tolist(),
        "observation_tokens": int(((attention_of_response == 1) & (mask == 0)).sum()),
        "rewards": scores.tolist(),
        "reward_extra_keys": sorted(reward_extra),
        "reward_extra": {k: [v.item() if hasattr(v, "item") else v for v in vals] for k, vals in reward_extra.items()},
        "advantage_error": advantage_error,
        "advantages_finite": bool(torch.isfinite(batch.batch["advantages"]).all()),
        "policy_loss": float(loss),
        "policy_loss_finite": bool(torch.isfinite(loss)),
        "loss_metrics": {k: float(v) for k, v in loss_metrics.items() if isinstance(v, (int, float, torch.Tensor))},
        "agg_loss": aggregates,
        "rollout_log_probs": rollout is not None,
        "logprob_gap": float((rollout - old_log_probs).abs()[sampled].max()) if rollout is not None and sampled.any() else None,
        "texts": texts,
        "ground_truths": gold,
        "data_sources": [str(d) for d in batch.non_tensor_batch["data_source"]],
        "response_width": width,
        "registry": json.loads(registry.read_text()) if (registry := Path(args["run"]) / "backends.json").exists() else None,
    }


def score_table(args: dict[str, Any]) -> dict[str, Any]:
    """verl's gsm8k scorer, directly and through default_compute_score, on (reply, truth) pairs."""
    from verl.utils.reward_score import default_compute_score, gsm8k

    table = args["table"]
    return {"gsm8k": [gsm8k.compute_score(reply, truth) for reply, truth in table],
            "default": [default_compute_score("openai/gsm8k", reply, truth) for reply, truth in table]}


def v1_batch(args: dict[str, Any]) -> dict[str, Any]:
    """verl 0.9.1's V1 trainer hands its manager a TensorDict: refused, naming the setting."""
    from tensordict import TensorDict

    from verl.utils.import_utils import load_class_from_fqn

    manager = load_class_from_fqn(FQN, "AgentLoopManager").create(config=compose(args))
    manager.generate_sequences(TensorDict({"dummy_tensor": torch.zeros(2, 1)}, batch_size=2))
    return {}


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

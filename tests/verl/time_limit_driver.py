"""Run inside verl's venv (tests/verl/env.py): SpoolLoopManager's time limit, seen from outside.

    python -m tests.verl.time_limit_driver ARGS.json   # prints {scenario: figures} as the last line

Each scenario builds its manager as verl does (`create(config=...)`: servers, then the warm-up)
and calls generate_sequences on verl batches; right when a call returns it looks at what verl
would put to sleep next: the backend's /metrics (requests running or waiting), the spool's
claims and pending jobs, and the call's meta_info.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

FQN = "orchestrator.trainer.verl.SpoolLoopManager"
BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def verl_batch(prompts: int, samples: int, tag: str) -> Any:
    import torch
    from verl import DataProto

    rows = [{"data_source": "openai/gsm8k", "ability": "math",
             "raw_prompt": [{"role": "user", "content": f"{tag}: what is {i} + 1?"}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(prompts)]
    batch = DataProto.from_single_dict({
        "dummy_tensor": torch.zeros((prompts, 1), dtype=torch.uint8),
        **{key: np.array([row[key] for row in rows], dtype=object) for key in rows[0]},
        "uid": np.array([str(uuid.uuid4()) for _ in rows], dtype=object),
    })
    batch.meta_info["global_steps"] = 1
    return batch.repeat(repeat_times=samples, interleave=True)


def busy(url: str) -> float:
    """Requests the backend is running or holding (vLLM's gauges; serve-llm has the same names)."""
    page = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(BUSY_GAUGES))


def spool_left(run: str) -> tuple[list[str], int]:
    from orchestrator.report.status import pending_count
    from orchestrator.spool.paths import SpoolPaths

    root = Path(run)
    held = sorted(p.name for p in root.joinpath("active").glob("*/*") if not p.name.startswith("."))
    return held, pending_count(SpoolPaths(root))


def config_of(args: dict[str, Any], scenario: dict[str, Any]) -> dict[str, Any]:
    block = {"spool": args["run"], "handler": "answer", "poll_s": 0.05, "time_limit_s": scenario["time_limit_s"],
             "cancel_grace_s": scenario.get("cancel_grace_s", 30.0), "sampling": scenario.get("sampling", {})}
    return {"actor_rollout_ref": {"model": {"path": args["model"]}, "rollout": {
                "n": scenario["samples"], "prompt_length": 256, "response_length": scenario["response_length"],
                "temperature": 1.0, "logprobs_mode": "processed_logprobs", "name": "vllm"}},
            "data": {"train_files": args.get("train_files")},
            "hpc_rollout": block}


def run(args: dict[str, Any], scenario: dict[str, Any]) -> dict[str, Any]:
    from verl.utils.import_utils import load_class_from_fqn

    began = time.monotonic()
    manager = load_class_from_fqn(FQN, "AgentLoopManager").create(config=config_of(args, scenario))
    figures: dict[str, Any] = {"create_s": round(time.monotonic() - began, 3), "calls": []}
    for call in range(scenario.get("calls", 1)):
        batch = verl_batch(scenario["prompts"], scenario["samples"], f"{scenario['name']} {call}")
        started = time.monotonic()
        output = manager.generate_sequences(batch)
        seconds = time.monotonic() - started
        busy_now = busy(args["url"])          # first: this is what verl's sleep would meet
        held, pending = spool_left(args["run"])
        ours = output.meta_info["hpc_rollout"]
        figures["calls"].append({"seconds": round(seconds, 3), "busy_at_return": busy_now, "held": held,
                                 "pending": pending, "ok": ours["ok"], "cancelled": ours["cancelled"],
                                 "missing": ours["missing"], "time_limit": ours.get("time_limit")})
    manager.close()
    return figures


if __name__ == "__main__":
    arguments = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps({s["name"]: run(arguments, s) for s in arguments["scenarios"]}))

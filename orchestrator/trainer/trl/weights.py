"""`SwapWeightsCallback`: after each optimizer step, every backend of the spool loads the new weights.

GRPOTrainer with a rollout function leaves weight sync to the caller (with use_vllm=False). At
`on_step_end` the model is saved to DIRECTORY/step-N (safetensors, as `save_pretrained` writes)
and `Spool.swap_weights(..., version=N)` makes every registered backend load it while serving;
then the policy version is N, the trainer's global step. Older checkpoints beyond `keep` are
deleted (a backend still loading one is given `keep` >= 2 to finish).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from orchestrator.llm.weights import SwapReport
from orchestrator.trainer.api import Spool


class SwapWeightsCallback(TrainerCallback):
    def __init__(self, spool: Spool, directory: str | Path, keep: int = 2, max_policy_lag: int | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: at least the checkpoint the backends serve must stay")
        self.spool = spool
        self.directory = Path(directory)
        self.keep = keep
        self.max_policy_lag = max_policy_lag
        self.swaps: list[SwapReport] = []

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        if model is None:
            raise RuntimeError("SwapWeightsCallback got no model at on_step_end: the trainer must pass it")
        version = int(state.global_step)
        checkpoint = self.directory / f"step-{version}"
        getattr(model, "module", model).save_pretrained(checkpoint)   # unwrapped from DDP, if wrapped
        self.swaps.append(self.spool.swap_weights(checkpoint, version=version, max_policy_lag=self.max_policy_lag))
        for old in range(version - self.keep, 0, -1):
            stale = self.directory / f"step-{old}"
            if not stale.exists():
                break
            shutil.rmtree(stale, ignore_errors=True)

"""`SpoolWeightTransfer`: TRL's `WeightTransferProtocol` (trl.experimental.async_grpo) through the
shared filesystem and `Spool.swap_weights`, in place of its NCCL stream into one vLLM server.

`send_weights` writes the streamed (name, tensor) pairs as one safetensors file beside the base
model's config and tokenizer files (DIRECTORY/v-N), then every backend of the spool loads it while
serving and the policy version becomes N (N counts the syncs, as the trainer's model_version
does). `pause` and `resume` do nothing: the backends keep serving through a reload, and a request
in flight finishes on the weights it started with (its turns carry their version).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.llm.weights import SwapReport
from orchestrator.trainer.api import Spool

# Files of the base model a checkpoint directory needs besides its weights (serve-llm and vLLM read them).
BESIDE_WEIGHTS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")


@dataclass
class SpoolWeightTransfer:
    spool: Spool
    base_model: Path                  # the model the trainer started from: its config and tokenizer files
    directory: Path                   # where the checkpoints go (on the shared filesystem)
    keep: int = 2
    max_policy_lag: int | None = None
    version: int = 0
    swaps: list[SwapReport] = field(default_factory=list)

    def init_weight_transfer(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def pause(self) -> None:
        """Nothing to pause: backends reload while serving."""

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        from safetensors.torch import save_file

        checkpoint = self.directory / f"v-{self.version + 1}"
        checkpoint.mkdir(parents=True, exist_ok=True)
        for pattern in BESIDE_WEIGHTS:
            for source in Path(self.base_model).glob(pattern):
                if source.name != "model.safetensors.index.json":   # one file holds every weight here
                    shutil.copy2(source, checkpoint / source.name)
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in iterator}
        save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
        self.version += 1
        self.swaps.append(self.spool.swap_weights(checkpoint, version=self.version, max_policy_lag=self.max_policy_lag))
        shutil.rmtree(self.directory / f"v-{self.version - self.keep}", ignore_errors=True)

    def resume(self) -> None:
        """Nothing to resume (see pause)."""

    def destroy(self) -> None:
        """Checkpoints stay (the backends serve the last one)."""

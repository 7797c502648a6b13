"""A checkpoint directory read for the reference server's weight reload (orchestrator/devserver/reload.py).

The directory is what `save_pretrained` writes (*.safetensors, or pytorch_model.bin), with the
served model's parameter names and shapes; anything else is refused with what does not fit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.errors import HpcRolloutError


class CheckpointError(HpcRolloutError, ValueError):
    """A checkpoint directory cannot be loaded into the served model."""


def read_state_dict(directory: Path, model: Any) -> dict[str, Any]:
    """The checkpoint's tensors, checked against the model's parameter names and shapes."""
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint {directory} is not a directory: pass the directory save_pretrained wrote")
    files = sorted(directory.glob("*.safetensors"))
    state: dict[str, Any] = {}
    if files:
        from safetensors.torch import load_file

        for file in files:
            state.update(load_file(str(file), device="cpu"))
    elif (directory / "pytorch_model.bin").is_file():
        import torch

        state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"checkpoint {directory} holds no *.safetensors or pytorch_model.bin")
    expected = model.state_dict()
    unknown = sorted(set(state) - set(expected))
    wrong = sorted(k for k in state if k in expected and tuple(state[k].shape) != tuple(expected[k].shape))
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = sorted(set(expected) - set(state) - tied)
    if unknown or wrong or missing:
        raise CheckpointError(
            f"checkpoint {directory} does not fit the served model: "
            + "; ".join(f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                        for label, names in (("unknown", unknown), ("shape differs", wrong), ("missing", missing)) if names)
        )
    return state

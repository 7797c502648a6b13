"""verl's actor weights as a Hugging Face checkpoint directory that any backend can reload.

`export_weights(actor_wg, directory)` runs `write_checkpoint` in every worker of verl's actor
worker group (`execute_with_func_generator`, verl's way of running a function with the worker):
each takes part in gathering the full tensors (`engine.get_per_tensor_param()`, the names and
tensors verl hands its own rollout engines), rank 0 writes them as `model.safetensors` beside the
model's config and tokenizer files, into a hidden directory renamed into place when complete.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def export_weights(actor_wg: Any, directory: Path, model_files: Sequence[str]) -> Path:
    """Write the actor's current weights to `directory` (replaced if it exists)."""
    import torch
    from verl import DataProto

    ranks = torch.arange(actor_wg.world_size)   # one row per rank: the dispatch gives each its own
    data = DataProto.from_dict(tensors={"rank": ranks},
                               meta_info={"directory": str(directory), "model_files": list(model_files)})
    actor_wg.execute_with_func_generator(write_checkpoint, data)
    if not (directory / "model.safetensors").is_file():
        raise RuntimeError(f"verl's actor did not write its weights to {directory}")
    return directory


def write_checkpoint(worker: Any, data: Any) -> Any:
    """In a verl actor worker: gather the weights; rank 0 writes them (see the module doc)."""
    import torch
    from safetensors.torch import save_file

    params, _ = worker.actor.engine.get_per_tensor_param()
    # Every rank iterates: gathering a sharded tensor is collective. clone(): tied weights
    # (embeddings = lm_head) must not share memory in a safetensors file.
    tensors = {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in params}
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        directory = Path(data.meta_info["directory"])
        partial = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
        source = Path(_model_dir(worker))
        for name in data.meta_info["model_files"]:
            if (source / name).is_file():
                shutil.copy2(source / name, partial / name)
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()   # nobody returns before the directory is complete
    return data


def _model_dir(worker: Any) -> str:
    """The local copy of actor_rollout_ref.model.path (verl's HFModelConfig.local_path)."""
    model_config = getattr(getattr(worker.actor, "engine", None), "model_config", None)
    return str(getattr(model_config, "local_path", None) or worker.config.model.path)

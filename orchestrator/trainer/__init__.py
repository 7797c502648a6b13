"""The trainer's side of the spool: the Python API (api.Spool), the lossless reader (tail, cursor),
batches, the async DAPO sampler and its adaptive budget.

    from orchestrator.trainer import GroupBatcher, DynamicSampler
"""

from __future__ import annotations

from orchestrator.trainer.adaptive import AdaptiveBudget
from orchestrator.trainer.batch import Advantage, Batch, BatchStats, FailedPolicy, GroupBatcher
from orchestrator.trainer.sampler import DynamicSampler, Leftovers, SampledBatch, SamplerStats

__all__ = [
    "AdaptiveBudget", "Advantage", "Batch", "BatchStats", "DynamicSampler", "FailedPolicy", "GroupBatcher", "Leftovers",
    "SampledBatch", "SamplerStats",
]

"""TRL on hpc-rollout: the spool as GRPOTrainer's rollout function (TRL >= 1.16, no patch to TRL).

    from trl import GRPOConfig, GRPOTrainer
    from orchestrator.trainer.api import Spool
    from orchestrator.trainer.trl import SpoolRollout, SwapWeightsCallback, spool_reward

    spool = Spool.open("spool/run1")              # workers running, backends registered
    rollout = SpoolRollout(spool)                 # prompts -> chat jobs; or task_of=... for any handler
    trainer = GRPOTrainer(model=MODEL_DIR, reward_funcs=[spool_reward], args=GRPOConfig(...),
                          train_dataset=dataset, rollout_func=rollout,
                          callbacks=[SwapWeightsCallback(spool, "ckpt/")])
    trainer.train()

docs/trainer.md "Train with TRL" has the whole story. TRL is imported only by the modules that
need it (this package's names resolve lazily), so `import orchestrator.trainer.trl.rollout` needs
no TRL.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SpoolRollout", "SwapWeightsCallback", "spool_reward", "SpoolRolloutWorker", "SpoolWeightTransfer"]


def __getattr__(name: str) -> Any:
    if name in ("SpoolRollout", "spool_reward"):
        from orchestrator.trainer.trl import rollout

        return getattr(rollout, name)
    if name == "SwapWeightsCallback":
        from orchestrator.trainer.trl.weights import SwapWeightsCallback

        return SwapWeightsCallback
    if name == "SpoolRolloutWorker":
        from orchestrator.trainer.trl.async_worker import SpoolRolloutWorker

        return SpoolRolloutWorker
    if name == "SpoolWeightTransfer":
        from orchestrator.trainer.trl.weight_transfer import SpoolWeightTransfer

        return SpoolWeightTransfer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

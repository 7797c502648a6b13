"""verl on hpc-rollout: the spool as verl's rollout engine (an optional extra: `pip install 'hpc-rollout[verl]'`).

    actor_rollout_ref.rollout.agent.agent_loop_manager_class=orchestrator.trainer.verl.SpoolLoopManager
    +hpc_rollout.spool=/scratch/spool/run1
    # verl's v1 trainer (trainer.use_v1=true, TransferQueue): ...=orchestrator.trainer.verl.SpoolLoopManagerTQ

verl is imported only by the modules that need it (manager, assemble, rewards at EVAL), and only
when used: importing this package, its key names (orchestrator/trainer/verl_keys.py) or its config block
(`settings`) needs no verl. docs/trainer.md "Train with verl" has the whole story.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SpoolLoopManager", "SpoolLoopManagerTQ"]


def __getattr__(name: str) -> Any:
    # `orchestrator.trainer.verl.SpoolLoopManager` is the name verl's config takes; resolving it
    # lazily keeps `import orchestrator.trainer.verl.settings` free of verl, torch and ray.
    if name == "SpoolLoopManager":
        from orchestrator.trainer.verl.manager import SpoolLoopManager

        return SpoolLoopManager
    if name == "SpoolLoopManagerTQ":
        from orchestrator.trainer.verl.tq_manager import SpoolLoopManagerTQ

        return SpoolLoopManagerTQ
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

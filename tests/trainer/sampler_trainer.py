"""A trainer stand-in for the sampler restart test: DynamicSampler steps, state persisted each step.

    python -m tests.trainer.sampler_trainer RUN_DIR STATE_DIR STEPS SEED

After each step it writes STATE_DIR/NNNNNNNN.json: the step, the groups trained (with each
row's policy version) and sampler.state(), together (tmp + rename), as a trainer saves them
with its checkpoint. A restarted process resumes from the newest file. Now and then it dies on
its own after a batch and before saving it (that batch must be sampled again); the test
SIGKILLs it at random moments. The registry's policy version moves with the steps (as
swap_weights would, with no backend to reload) and the sleep jobs report the version current
when they ran, so groups that wait too long turn stale.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LAG = 0   # a group carried over to the next step is stale: the bound is exercised at every step


def prompts(rng: random.Random) -> Iterator[dict[str, Any]]:
    index = 0
    while True:
        index += 1
        yield {"run": {"uniform": [0.02, 0.4]}, "seed": rng.randrange(10**6), "policy_version": "current",
               "reward": {"bernoulli": [0.0, 1.0, 0.5, 0.5][index % 4]}}


def main() -> None:
    run_dir, state, steps, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    from orchestrator.trainer.api import Spool
    from orchestrator.llm.registry import BackendRegistry
    from orchestrator.trainer import DynamicSampler

    rng = random.Random(seed)
    saved = sorted(p for p in state.iterdir() if p.suffix == ".json")
    last = json.loads(saved[-1].read_text()) if saved else {"step": 0, "sampler": None}
    step = last["step"] + 1
    spool = Spool.open(run_dir)
    registry = BackendRegistry(spool.paths)
    sampler = DynamicSampler(spool, prompts(rng), handler="sleep", samples=3,
                             informative_groups=2, max_policy_lag=LAG, state=last["sampler"], poll_s=0.02)
    while step <= steps:
        registry.set_versions([], version=step, min_version=max(step - LAG, 0))   # "the weights of step"
        batch = sampler.next_batch(policy_version=step, timeout_s=300)
        if rng.random() < 0.15:
            os._exit(3)   # crashed after sampling, before saving: these groups must come again
        trained = {group[0]["group_id"]: [r["policy_version_min"] for r in group] for group in batch.groups}
        tmp = state / f".{step:08d}.tmp"
        tmp.write_text(json.dumps({"step": step, "trained": trained, "sampler": sampler.state()}))
        os.rename(tmp, state / f"{step:08d}.json")
        step += 1


if __name__ == "__main__":
    main()

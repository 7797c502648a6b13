"""One shard writer of the tail test, as its own process with a skewed wall clock.

    python -m tests.trainer.tail_writer RUN_DIR WORKER_ID SKEW_S PLAN.json SEED

PLAN.json lists the rows this writer commits ({job_id, group_id, group_size, sample_index});
they are committed as shards of 1-9 rows with random pauses, so writers interleave at random.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path


def main() -> None:
    run_dir, worker_id, skew, plan, seed = sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
    real_time = time.time
    time.time = lambda: real_time() + skew   # the injected clock: this node is off by SKEW_S

    from orchestrator.config import Shards
    from orchestrator.spool.paths import SpoolPaths
    from orchestrator.spool.shards import ShardWriter

    rng = random.Random(seed)
    rows = json.loads(plan.read_text())
    writer = ShardWriter(SpoolPaths.of(run_dir), worker_id, Shards())
    while rows:
        size = rng.randint(1, 9)
        take, rows = rows[:size], rows[size:]
        for row in take:
            writer.add({**row, "status": "ok", "reward": float(row["sample_index"] % 2)}, row["job_id"])
        time.sleep(rng.uniform(0.0, 0.08))
        writer.commit()
    if rng.random() < 0.5:
        writer.close()   # a clean stop; the others look crashed (their writer stays open)


if __name__ == "__main__":
    main()

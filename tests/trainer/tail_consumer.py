"""A trainer stand-in for the tail test: consumes rows, groups or batches, persisting its cursor.

    python -m tests.trainer.tail_consumer RUN_DIR STATE_DIR MODE SEED

MODE batches takes Arrow batches, and now and then a single row first (so some batches are
made of rows held across a restart).

Each delivered item is saved, with the cursor taken right after it, as STATE_DIR/NNNNNNNN.json
(tmp + rename: the item and the cursor are persisted together or not at all). A restarted
consumer resumes from the newest file's cursor. With a small probability it dies on its own
right after receiving an item and before saving it (that item must come again), and the test
SIGKILLs it at random moments. It exits once STATE_DIR/../writers-done exists and nothing new
arrived for a second.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.trainer.tail import RowReader


def main() -> None:
    run_dir, state, mode, seed = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    from orchestrator.spool.paths import SpoolPaths
    from orchestrator.trainer.tail import RowReader

    rng = random.Random(seed)
    saved = sorted(p for p in state.iterdir() if p.suffix == ".json")
    count = int(saved[-1].stem) if saved else 0
    cursor = json.loads(saved[-1].read_text())["cursor"] if saved else None
    reader = RowReader(SpoolPaths.of(run_dir), cursor, poll_s=0.02)
    done_flag = state.parent / "writers-done"
    idle_since = time.monotonic()
    while True:
        item = next_item(reader, mode, rng)
        if item is None:
            if mode == "groups" and reader.poll():
                continue
            if done_flag.exists() and time.monotonic() - idle_since > 1.0:
                return
            time.sleep(0.02)
            continue
        idle_since = time.monotonic()
        if rng.random() < (0.003 if mode == "rows" else 0.03):
            os._exit(3)   # crashed after receiving, before persisting: the item must come again
        jobs = item if mode in ("groups", "batches") else [item]
        count += 1
        tmp = state / f".{count:08d}.tmp"
        tmp.write_text(json.dumps({"jobs": [r["job_id"] for r in jobs], "cursor": str(reader.cursor)}))
        os.rename(tmp, state / f"{count:08d}.json")


def next_item(reader: RowReader, mode: str, rng: random.Random) -> Any:
    """A group, a row, or a batch's rows (as dicts with job_id); None when nothing is there."""
    if mode == "groups":
        return reader.take_group()
    if mode == "rows" or rng.random() < 0.2:
        row = next(reader.rows(), None)
        return row if mode == "rows" or row is None else [row]
    batch = next(reader.batches(), None)
    return None if batch is None else [{"job_id": job} for job in batch.column("job_id").to_pylist()]


if __name__ == "__main__":
    main()

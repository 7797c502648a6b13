"""A DynamicSampler trainer SIGKILLed at random and restarted from its persisted state."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.trainer.api import Spool
from orchestrator.spool.staleness import row_is_stale
from orchestrator.report.status import pending_count
from tests.core.util import FAST, rows, start_worker, stop_worker, wait_until
from tests.trainer.sampler_trainer import LAG

STEPS = 8


def test_a_sampler_killed_and_restarted_loses_no_group_and_trains_none_twice(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run", **{**FAST, "pools.run": 8, "shards.idle_flush_s": 0.05})
    state = tmp_path / "state"
    state.mkdir()
    rng = random.Random(11)
    worker = start_worker(spool.paths)
    kills = 0
    try:
        for attempt in range(200):
            trainer = start_trainer(spool, state, seed=attempt)
            if kills < 4:
                time.sleep(rng.uniform(0.5, 2.5))
                if trainer.poll() is None:
                    trainer.send_signal(signal.SIGKILL)
                    kills += 1
            if trainer.wait(timeout=600) == 0:
                break
        wait_until(lambda: pending_count(spool.paths) == 0, 180, "the groups still in flight to finish")
    finally:
        stop_worker(worker)
    saved = [json.loads(p.read_text()) for p in sorted(state.glob("*.json"))]
    assert [s["step"] for s in saved] == list(range(1, STEPS + 1)) and kills == 4

    trained = [group for s in saved for group in s["trained"]]
    assert len(trained) == len(set(trained)) == 2 * STEPS, "a group was trained twice"
    for s in saved:   # the staleness bound, at the step each group was trained in
        for group, versions in s["trained"].items():
            assert all(v >= s["step"] - LAG for v in versions), (s["step"], group, versions)

    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows(spool.paths):
        by_group[row["group_id"]].append(row)
    # No group lost: one that left the sampler's books between two saved steps was trained in the
    # later step, or judged there and left out for a reason its rows show (stale, all rewards equal).
    before: dict[str, Any] = {}
    left_out_stale = 0
    for s in saved:
        outstanding = s["sampler"]["outstanding"]
        for group in set(before) - set(outstanding):
            if group in s["trained"]:
                continue
            members = by_group[group]
            stale = any(row_is_stale(r, s["step"], LAG) for r in members)
            assert stale or len({r["reward"] for r in members}) == 1, f"group {group} was lost at step {s['step']}"
            left_out_stale += stale
        before = outstanding
    assert left_out_stale > 0, "no group turned stale: the bound was not exercised"
    # The ones still on the books at the end are all in the spool, waiting after the last cursor.
    reader = spool.reader(saved[-1]["sampler"]["cursor"], columns=["reward"])
    waiting = {group[0]["group_id"] for group in reader.groups()}
    assert set(before) <= waiting, f"groups on the books but never deliverable: {sorted(set(before) - waiting)}"
    assert set(trained).isdisjoint(waiting), "a trained group would come again after the last cursor"


def start_trainer(spool: Spool, state: Path, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.trainer.sampler_trainer", str(spool.paths.root),
                             str(state), str(STEPS), str(seed)])

"""The one lock of spool/lease.py, contended for by three nodes of the NFS-like rig at a Linux
client's default cache times: exactly one holder at a time, and no holder broken while it renews.

Each holder keeps the lock longer than the staleness the others judge it by (it renews: its token
moves to the next name), so a contender that judged on a stale listing would break a healthy
holder. All nodes are processes of this host: their wall clocks are one clock, so the holding
intervals they print can be compared directly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fsrig.conftest import needs_rig
from tests.fsrig.rig import NFS_DEFAULTS, REPO, Rig

pytestmark = needs_rig

STALE_S = 2.5      # what a contender judges a silent holder by
HOLD_S = 3.5       # longer than that: only renewals keep the lock
ROUNDS = 2
HOLDER = """
import json, sys, time
from pathlib import Path
from orchestrator.spool.lease import acquire
lock_path, me, rounds, hold, stale = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
held = []
for _ in range(rounds):
    lock = acquire(lock_path, timeout_s=120, stale_s=stale, holder=me)
    start, kept = time.time(), True
    while kept and time.time() < start + hold:
        time.sleep(0.3)
        kept = lock.renew()
    end = time.time()
    lock.release()
    held.append([start, end, kept])
    time.sleep(0.05)
print(json.dumps(held))
"""


def test_three_nodes_take_turns_and_no_renewing_holder_is_broken(tmp_path: Path) -> None:
    (tmp_path / "view").mkdir()
    rig = Rig(tmp_path / "server", tmp_path / "view", NFS_DEFAULTS)
    (rig.base / "locks").mkdir(parents=True)
    lock = rig.at / "locks" / "registry"
    nodes = [subprocess.Popen(rig.node([sys.executable, "-c", HOLDER, str(lock), name, str(ROUNDS), str(HOLD_S),
                                        str(STALE_S)]), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for name in ("a", "b", "c")]
    outputs = [node.communicate(timeout=180) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    intervals = sorted((start, end, kept, name) for (out, _), name in zip(outputs, "abc")
                       for start, end, kept in json.loads(out))
    assert len(intervals) == 3 * ROUNDS
    assert all(kept for _, _, kept, _ in intervals), "a holder that renewed was broken: " + repr(intervals)
    for (_, end, _, first), (start, _, _, second) in zip(intervals, intervals[1:]):
        assert start >= end, f"{second} took the lock at {start:.3f}, {first} held it until {end:.3f}"
    assert not (rig.base / "locks" / "registry").exists(), "the last release removed the lock"

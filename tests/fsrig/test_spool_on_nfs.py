"""The spool across nodes whose filesystem clients cache: a worker, a trainer and the user's
commands, each a node of the NFS-like rig (tests/fsrig), at a Linux client's default cache times.

What other nodes create is found by name (control/stop, the next shard of a writer) or by a
listing (cancel/): with "does not exist" cached until the directory's attributes expire (acdirmin,
30 s), each must still be seen within a poll. With `nocto` no open revalidates anything, and the
bound is the directory attribute time, once for each node in the chain (docs/robustness.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.spool.events import events_named
from orchestrator.submission.submit import submit_rows
from tests.core.util import make_run, rows, wait_until
from tests.fsrig.conftest import needs_rig
from tests.fsrig.nfsview import ClientTimes
from tests.fsrig.rig import NFS_DEFAULTS, REPO, Rig, sees_through_view, start_worker

pytestmark = needs_rig

SETTINGS = {"shards.idle_flush_s": 0.2, "shards.max_age_s": 0.5, "shutdown.grace_s": 5.0}
FOLLOW = """
import json, sys, time
from orchestrator.trainer.api import Spool
for row in Spool.open(sys.argv[1]).reader(poll_s=0.2).rows(follow=True):
    print(json.dumps({"job": row["job_id"], "status": row["status"], "t": time.monotonic()}), flush=True)
"""
CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
# (client, the bound on seeing what another node created: seconds after it is there). With nocto
# each listing and lookup may be a directory attribute time stale: the worker finds the new tickets
# up to acdirmin late, and the trainer their shards up to acdirmin after that.
CLIENTS = {"nfs": (NFS_DEFAULTS, 4.0), "nocto": (ClientTimes(acdirmin=6.0, cto=False), 2 * 6.0 + 4.0)}


def quick_jobs(paths_root: Path, count: int) -> list[str]:
    from orchestrator.spool.paths import SpoolPaths

    report = submit_rows(SpoolPaths.of(paths_root), [(n, {"handler": "sleep", "instance": {"run": 0.1}})
                                                    for n in range(count)])
    prefix = report.first_job.rsplit("-", 2)[0]
    return [f"{prefix}-{n:07d}-0000" for n in range(count)]


@pytest.mark.parametrize("view", list(CLIENTS))
def test_stop_cancel_and_new_shards_reach_other_nodes_within_the_stated_bound(tmp_path: Path, view: str) -> None:
    client, bound = CLIENTS[view]
    rig = Rig(tmp_path / "server", tmp_path / "view", client)
    rig.base.mkdir()
    rig.at.mkdir()
    paths = make_run(rig.base / "run", **SETTINGS)
    worker = start_worker(rig, paths.root, "--run-pool", "4")
    trainer = rig.popen([sys.executable, "-c", FOLLOW, str(rig.seen_from_node(paths.root))], stdout=subprocess.PIPE,
                        text=True, start_new_session=True)
    assert trainer.stdout is not None
    try:
        wait_until(lambda: sees_through_view(worker.pid, rig.at) and sees_through_view(trainer.pid, rig.at), 30,
                   "the views")

        def received(count: int) -> dict[str, dict[str, object]]:
            got: dict[str, dict[str, object]] = {}
            while len(got) < count:
                line = trainer.stdout.readline()   # type: ignore[union-attr]
                assert line, "the trainer stopped"
                record = json.loads(line)
                got[str(record["job"])] = record
            return got

        # 1. New shards: the trainer has looked for each writer's next shard while it was missing.
        received(len(quick_jobs(paths.root, 4)))
        time.sleep(2)
        submitted = time.monotonic()
        second = quick_jobs(paths.root, 4)
        latest = max(float(r["t"]) for r in received(len(second)).values())   # type: ignore[arg-type]
        assert latest - submitted <= bound, f"new shards reached the trainer {latest - submitted:.1f}s later"

        # 2. Cancel from another node: a running job ends `cancelled` within the bound.
        slow = submit_rows(paths, [(1, {"handler": "sleep", "instance": {"run": 120}})]).first_job
        wait_until(lambda: any(p.name == slow for d in paths.active.iterdir() if d.is_dir() for p in d.iterdir()),
                   30, "the slow job to be claimed")
        subprocess.run(rig.node([*CLI, "cancel", str(rig.seen_from_node(paths.root)), slow]), cwd=REPO, check=True,
                       capture_output=True, timeout=60)
        asked = time.monotonic()   # the request is on the server
        wait_until(lambda: any(r["job_id"] == slow and r["status"] == "cancelled" for r in rows(paths)), 60,
                   "the cancelled row")
        assert time.monotonic() - asked <= bound + 2, f"the cancel took {time.monotonic() - asked:.1f}s"

        # 3. Stop from another node: the worker drains and leaves within the bound and its grace.
        subprocess.run(rig.node([*CLI, "stop", str(rig.seen_from_node(paths.root)), "--no-wait"]), cwd=REPO,
                       check=True, capture_output=True, timeout=60)
        asked = time.monotonic()
        assert worker.wait(timeout=120) == 0
        assert time.monotonic() - asked <= bound + SETTINGS["shutdown.grace_s"], \
            f"the stop took {time.monotonic() - asked:.1f}s"
    finally:
        for process in (worker, trainer):
            if process.poll() is None:
                process.kill()
                process.wait()


WRITER = """
import sys, time
from orchestrator.config import RunConfig
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool import access
from orchestrator.spool.paths import SpoolPaths
run, me, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
paths = SpoolPaths.of(run)
access.open_for(paths, RunConfig.load(paths.run_config).access)
while time.time() < start:
    time.sleep(0.01)
for n in range(8):
    BackendRegistry(paths).add(f"http://{me}.example:{8000 + n}/v1", version=1)
"""


@pytest.mark.parametrize("view", ["nfs", "nocto"])
def test_backend_adds_from_three_nodes_at_once_lose_nothing(tmp_path: Path, view: str) -> None:
    """Each `backend add` takes the writers' lock (spool/lease.py), reads the registry and replaces
    it. (With nocto the lock's holder is seen up to the directory attribute time late, so the
    waiting writers' patience, 30 s, must exceed it: acdirmin 4 s here; docs/robustness.md.)"""
    client = NFS_DEFAULTS if view == "nfs" else ClientTimes(acregmin=2.0, acdirmin=4.0, cto=False)
    rig = Rig(tmp_path / "server", tmp_path / "view", client)
    rig.base.mkdir()
    rig.at.mkdir()
    paths = make_run(rig.base / "run")
    start = time.time() + 3
    writers = [rig.popen([sys.executable, "-c", WRITER, str(rig.seen_from_node(paths.root)), f"node{k}", str(start)],
                         stderr=subprocess.PIPE) for k in range(3)]
    errors = [writer.communicate(timeout=300)[1].decode(errors="replace") for writer in writers]
    assert [w.returncode for w in writers] == [0, 0, 0], errors
    backends = json.loads((paths.root / "backends.json").read_text())["backends"]
    assert len(backends) == 24, f"{24 - len(backends)} adds were lost"
    assert not list(paths.quarantine.iterdir()), "a registry was set aside"


FOLLOW_WITH_CURSOR = """
import json, sys
from orchestrator.trainer.api import Spool
reader = Spool.open(sys.argv[1]).reader(sys.argv[2] or None, poll_s=0.2)
for row in reader.rows(follow=True):
    print(json.dumps({"job": row["job_id"], "cursor": str(reader.cursor)}), flush=True)
"""


def test_a_trainer_killed_and_resumed_on_another_node_sees_every_row_once(tmp_path: Path) -> None:
    """The trainer follows from its own node, is SIGKILLed twice while shards land, and resumes
    each time from the last cursor it printed: every row once, none lost (NFS defaults)."""
    rig = Rig(tmp_path / "server", tmp_path / "view", NFS_DEFAULTS)
    rig.base.mkdir()
    rig.at.mkdir()
    paths = make_run(rig.base / "run", **SETTINGS)
    jobs = set(quick_jobs(paths.root, 60))
    worker = start_worker(rig, paths.root, "--run-pool", "2")
    seen: list[str] = []
    cursor = ""
    try:
        for round_ in range(3):
            trainer = rig.popen([sys.executable, "-c", FOLLOW_WITH_CURSOR, str(rig.seen_from_node(paths.root)), cursor],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
            assert trainer.stdout is not None
            wanted = len(seen) + (15 if round_ < 2 else len(jobs) - len(seen))
            while len(seen) < wanted:
                line = trainer.stdout.readline()
                assert line, "the trainer stopped"
                record = json.loads(line)
                seen.append(str(record["job"]))
                cursor = str(record["cursor"])
            trainer.kill()   # SIGKILL: what it printed last is all it kept
            trainer.wait()
        assert sorted(seen) == sorted(jobs), "a row was lost or seen twice"
    finally:
        worker.kill()
        worker.wait()


def test_idle_workers_on_their_nodes_leave_once_drained_and_not_before(tmp_path: Path) -> None:
    """Elastic exit across caching clients: two workers with --idle-exit take every job (none
    leaves while the queues still show work to it) and each leaves once there is none."""
    rig = Rig(tmp_path / "server", tmp_path / "view", NFS_DEFAULTS)
    rig.base.mkdir()
    rig.at.mkdir()
    paths = make_run(rig.base / "run", **SETTINGS)
    jobs = set(quick_jobs(paths.root, 40))
    workers = [start_worker(rig, paths.root, "--idle-exit", "4") for _ in range(2)]
    try:
        codes = [worker.wait(timeout=180) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    assert codes == [0, 0]
    assert sorted(row["job_id"] for row in rows(paths)) == sorted(jobs), "a job was left behind or run twice"
    assert len(events_named(paths, "idle_exit")) == 2, "each worker left because it was idle"


TWO_READERS = """
import sys, time
from orchestrator.config import RunConfig
from orchestrator.llm.errors import RegistryCorrupt
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool import access
from orchestrator.spool.paths import SpoolPaths
paths = SpoolPaths.of(sys.argv[1])
access.open_for(paths, RunConfig.load(paths.run_config).access)
BackendRegistry(paths).read()                        # one reader of this node: its client caches the file's size
print("read", flush=True)
sys.stdin.readline()                                 # ...until another node replaced it with a longer one
second = BackendRegistry(paths, quarantine_unusable=True)   # a worker's other reader, reading it anew
for attempt in range(40):                            # as a worker's routing does while it waits
    try:
        print(len(second.read().backends), flush=True)
        break
    except RegistryCorrupt:
        time.sleep(0.2)
"""


def test_a_registry_read_cut_short_by_a_stale_client_is_not_set_aside(tmp_path: Path) -> None:
    """A nocto client shows a registry another node replaced cut to the size it had cached: that
    read fails to parse, but the registry is fine; it must not be moved to quarantine (an outage
    for every worker until someone runs `backend add`), only read again once the cache expires."""
    rig = Rig(tmp_path / "server", tmp_path / "view", ClientTimes(acregmin=3.0, acdirmin=3.0, cto=False))
    rig.base.mkdir()
    rig.at.mkdir()
    paths = make_run(rig.base / "run")
    run = str(rig.seen_from_node(paths.root))
    add = "import sys; from orchestrator.llm.registry import BackendRegistry; " \
          "[BackendRegistry.of(sys.argv[1]).add(f'http://h{n}.example:8000/v1') for n in range(int(sys.argv[2]))]"
    subprocess.run(rig.node([sys.executable, "-c", add, run, "1"]), cwd=REPO, check=True, capture_output=True)
    reader = rig.popen([sys.executable, "-c", TWO_READERS, run], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       text=True)
    assert reader.stdout is not None and reader.stdin is not None
    assert reader.stdout.readline().strip() == "read"
    subprocess.run(rig.node([sys.executable, "-c", add, run, "4"]), cwd=REPO, check=True, capture_output=True)
    reader.stdin.write("\n")
    reader.stdin.flush()
    answer = reader.stdout.readline().strip()
    assert reader.wait(timeout=60) == 0
    assert not list(paths.quarantine.iterdir()), "the registry was set aside"
    assert answer == "4", f"once the client's cache expired the registry read whole: {answer!r}"
    assert len(json.loads((paths.root / "backends.json").read_text())["backends"]) == 4

"""The fault suite: the faults a cluster really has, all in one bounded run, while a trainer follows it.

Real workers, sandboxes, files, signals and an LLM server process, on a spool that is a small
tmpfs (so a full disk is a real ENOSPC). In one run:
  SIGKILL of a worker (its last shard torn), SIGSTOP of another past its lease, a backend outage,
  a full spool, poison rows,
and then: every job has exactly one row (and the trainer saw it exactly once), no claim is left,
no sandbox process is left, and every row that is not `ok` says why.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchestrator.trainer.api import Spool
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shardlog import WriterDirectory, parse_shard_name, shard_name
from orchestrator.spool.shards import shard_names
from orchestrator.report.status import pending_count
from orchestrator.submission.submit import submit_file
from orchestrator.spool.events import events_named
from tests.core.util import make_run, rows, start_worker, stop_worker, wait_until, write_jsonl
from tests.fsrig.rig import NFS_DEFAULTS, Rig, sees_through_view, start_worker as start_rig_worker
from tests.faults.fake_vllm import POISON_SEED, FakeVLLM
from tests.faults.helpers import chat_task, fill_disk, register, small_tmpfs
from tests.sandbox.helpers import needs_bwrap, sandbox_processes

pytest.importorskip("torch")  # the chat handler's tokenizer is the tiny model's
pytestmark = needs_bwrap

SETTINGS = {
    "leases.heartbeat_s": 0.3, "leases.lease_s": 3.0, "jobs.max_attempts": 5,
    "shards.max_age_s": 0.5, "shards.idle_flush_s": 0.2, "shutdown.grace_s": 5.0,
    "llm.outage_wait_s": 60.0, "llm.request_timeout_s": 10.0, "sandbox.runtime": "bwrap",
}


class Trainer(threading.Thread):
    """Follows the run through the Python reader (a resumable cursor), as a trainer would."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.reader = Spool.open(root).reader()
        self.seen: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.seen += [row["job_id"] for row in self.reader.rows()]
                time.sleep(0.2)
            self.seen += [row["job_id"] for row in self.reader.rows()]
        except BaseException as exc:  # reported by the test
            self.error = exc


def heartbeat_of(paths: SpoolPaths, process: Any) -> tuple[str, dict[str, Any]] | None:
    for path in paths.workers.glob("*.json"):
        try:
            info = orjson.loads(path.read_bytes())
        except ValueError:
            continue
        if info.get("pid") == process.pid:
            return path.name[:-5], info
    return None


def explain(paths: SpoolPaths) -> str:
    """What is where and what the workers said last: for a run that did not drain."""
    from orchestrator.config import RunConfig
    from orchestrator.report.status import snapshot

    snap = snapshot(paths, RunConfig.load(paths.run_config), with_rows=False)
    where = {name: sorted(p.name for p in (paths.active / name).iterdir()) for name in snap.claimed}
    tails = "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                      for log in sorted(paths.root.glob("worker-*.log")))
    return f"queued {snap.queued}, claimed {where}, hidden {[p.name for p in paths.active.glob('.*')]}\n{tails}"


def writer_story(paths: SpoolPaths, writers: list[str], victim_id: str, sleeper_id: str) -> str:
    """For writers left open: whose they were, where their heartbeats are, what the logs said of them."""
    lines = [f"victim {victim_id}, sleeper {sleeper_id}",
             f"heartbeats {sorted(p.name for p in paths.workers.glob('*.json'))}",
             f"gone {sorted(p.name for p in (paths.workers / 'gone').glob('*'))}",
             f"closed {sorted(WriterDirectory(paths).closed())}"]
    for log in sorted(paths.root.glob("worker-*.log")):
        lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                  if any(w.split("+")[0] in line for w in writers) or "lost its lease" in line]
    return "\n".join(lines[-80:])


def submit(paths: SpoolPaths, tmp: Path, name: str, tasks: list[dict[str, Any]], **options: Any) -> list[str]:
    report = submit_file(paths, write_jsonl(tmp / f"{name}.jsonl", tasks), **options)
    prefix = report.first_job.rsplit("-", 2)[0]
    return [f"{prefix}-{index:07d}-0000" for index in range(report.jobs)]


# "nfs": every worker a node of the NFS-like rig (tests/fsrig), at a Linux client's default cache
# times; the lease is sized above the attribute cache (acregmin 3 s), as docs/robustness.md says.
VIEWS = {"local": {}, "nfs": {"leases.lease_s": 8.0}}


@pytest.mark.parametrize("view", list(VIEWS))
def test_exactly_once_under_a_mix_of_faults(tmp_path: Path, view: str) -> None:
    runtime = tmp_path / "rt"
    env = {"HPC_ROLLOUT_RUNTIME_DIR": str(runtime), "HPC_ROLLOUT_LOOPBACK_DIR": str(tmp_path / "lo")}
    with small_tmpfs(tmp_path / "disk", 64) as disk, FakeVLLM() as llm:
        paths = make_run(disk / "run", **{**SETTINGS, **VIEWS[view]})
        if view == "local":
            def start(*args: str) -> Any:
                return start_worker(paths, *args, env=env)
        else:
            (tmp_path / "view").mkdir()
            rig = Rig(disk, tmp_path / "view", NFS_DEFAULTS)

            def start(*args: str) -> Any:
                return start_rig_worker(rig, paths.root, *args, env=env)
        register(paths, llm.url)
        sleepy = {"handler": "sleep", "instance": {"init": 0.01, "run": {"uniform": [0.5, 1.5]}, "seed": 5}}
        shell = {"handler": "shell", "instance": {"commands": ["echo $((6 * 7)) > answer", "sleep 0.3", "cat answer"],
                                                  "expect": "42"}}
        jobs = submit(paths, tmp_path, "sleep", [sleepy] * 150)
        jobs += submit(paths, tmp_path, "shell", [shell] * 6)
        chats = submit(paths, tmp_path, "chat", [chat_task(i) for i in range(10)])
        poison = submit(paths, tmp_path, "poison", [chat_task(i) for i in range(2)], sampling={"seed": POISON_SEED})
        jobs += chats + poison

        trainer = Trainer(paths.root)
        trainer.start()
        workers = [start("--run-pool", "4") for _ in range(3)]
        victim, sleeper = workers[0], workers[1]
        if view != "local":   # the workers really work through their views, not on the disk itself
            wait_until(lambda: all(sees_through_view(w.pid, rig.at) for w in workers), 30, "the views")
        try:
            # 1. SIGKILL, with a torn last shard: a truncated copy of a shard, as the victim's next one.
            wait_until(lambda: shard_names(paths) and heartbeat_of(paths, victim), 120, "first shards")
            victim_id = heartbeat_of(paths, victim)[0]  # type: ignore[index]
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            written = [parse_shard_name(n) for n in shard_names(paths)]
            torn = shard_name(victim_id, 1 + max((seq for w, seq in filter(None, written) if w == victim_id), default=0))
            if victim_id not in WriterDirectory(paths).all_writers():
                (WriterDirectory(paths).open_dir / victim_id).parent.mkdir(parents=True, exist_ok=True)
                (WriterDirectory(paths).open_dir / victim_id).touch()   # it died before its first commit
            data = (paths.shards / shard_names(paths)[0]).read_bytes()
            (paths.shards / torn).write_bytes(data[: len(data) // 3])
            workers.append(start("--run-pool", "4"))

            # 2. SIGSTOP past the lease: the paused worker's claims are taken over while it sleeps.
            wait_until(lambda: sleeper.poll() is not None or heartbeat_of(paths, sleeper), 60, "its heartbeat")
            assert sleeper.poll() is None, explain(paths)
            sleeper_id = heartbeat_of(paths, sleeper)[0]  # type: ignore[index]
            os.kill(sleeper.pid, signal.SIGSTOP)
            wait_until(lambda: not paths.claims(sleeper_id).exists(), 60, "the paused worker's claims to be taken")

            # 3. A backend outage while it is paused: the LLM server is gone for a few seconds.
            llm.stop()
            time.sleep(3)
            os.kill(sleeper.pid, signal.SIGCONT)
            llm.start()

            # 4. A full spool for a few seconds.
            filler = fill_disk(disk)
            time.sleep(3)
            filler.unlink()

            try:
                wait_until(lambda: pending_count(paths) == 0, 240, "the queues to drain")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{explain(paths)}") from None
        finally:
            for process in workers:
                if process.poll() is None:
                    os.kill(process.pid, signal.SIGCONT)
            try:
                codes = [stop_worker(process) for process in workers if process is not victim]
            except Exception as exc:
                raise AssertionError(f"a worker did not stop: {exc}\n{explain(paths)}") from None
            trainer.stop.set()
            trainer.join(60)

        # exactly once, nothing lost, for the shards and for the trainer that followed them
        got = rows(paths)
        counts = Counter(row["job_id"] for row in got)
        assert sorted(counts) == sorted(jobs), "a job was lost or one appeared from nowhere"
        assert max(counts.values()) == 1, [j for j, c in counts.items() if c > 1]
        assert trainer.error is None, trainer.error
        assert Counter(trainer.seen) == counts, "the trainer must see each row exactly once"

        # every failure explained; the ones that had to fail did, the others did not
        by_job = {row["job_id"]: row for row in got}
        for row in got:
            if row["status"] != "ok":
                assert row["error"] and row["error_stage"], row
        assert {by_job[j]["status"] for j in poison} == {"failed"}
        assert all("RowEncodingError" in by_job[j]["error"] for j in poison)
        assert {by_job[j]["status"] for j in chats} == {"ok"}, [by_job[j]["error"] for j in chats]
        assert {row["status"] for j, row in by_job.items() if j not in poison} == {"ok"}

        # no stuck claim, no leftover reaping, no orphan process, workers alive to the end
        assert codes == [0] * len(codes), f"{codes}\n{explain(paths)}"
        assert not [p for d in paths.active.iterdir() for p in (d.iterdir() if d.is_dir() else [d])]
        left_open = WriterDirectory(paths).open()
        assert left_open == [], f"the killed and the fenced worker's writers are closed too: {left_open}\n" \
            + writer_story(paths, left_open, victim_id, sleeper_id)
        assert sandbox_processes(runtime) == []
        assert any(n.name.startswith(torn) and n.name.endswith(".reason") for n in paths.quarantine.iterdir())
        logs = "".join(p.read_text(errors="replace") for p in paths.root.glob("worker-*.log"))
        assert "lost its lease" in logs and "No space left on device" in logs
        fenced = {event["worker"] for event in events_named(paths, "lease_lost")}
        assert fenced <= {sleeper_id}, f"only the paused worker may lose its lease, not {fenced - {sleeper_id}}"

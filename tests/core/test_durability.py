"""Durability, checked on the system calls a real submit and a real worker make (strace):
what a node crash must not undo is flushed, file then directory, before anything depends on it."""

from __future__ import annotations

import re
import shutil
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from orchestrator.spool.batches import may_hold_job
from orchestrator.spool.launches import request_stop
from orchestrator.spool.shard_reader import read_shard, shard_names
from tests.core.util import make_run, write_jsonl

pytestmark = pytest.mark.skipif(shutil.which("strace") is None,
                                reason="strace is not installed (scripts/test.sh installs it as root)")

CALLS = "fsync,fdatasync,syncfs,rename,renameat,renameat2,unlink,unlinkat"
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
FD_PATH = re.compile(r"^\w+\(\d+<([^>]*)>")


def traced(argv: list[str], trace: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["strace", "-f", "-y", "-s", "4096", "-qq", "-e", f"trace={CALLS}", "-o", str(trace),
                           *argv], capture_output=True, text=True, timeout=timeout)


def calls(trace: Path) -> list[tuple[str, list[str]]]:
    """(call, paths) of successful calls in the order they returned; fsync's path is its descriptor's (-y).

    With several threads, strace splits a call into `<unfinished ...>` and `<... resumed>` lines.
    """
    found = []
    pending: dict[str, tuple[str, list[str]]] = {}
    for line in trace.read_text().splitlines():
        pid, _, body = line.partition(" ")
        body = body.strip()
        if body.startswith("<..."):
            started = pending.pop(pid, None)
            if started is not None and "= -1" not in body:
                found.append(started)
            continue
        name = body.split("(", 1)[0]
        if name in ("fsync", "fdatasync", "syncfs"):
            match = FD_PATH.match(body)
            call = (name, [match.group(1)] if match else [])
        elif name.startswith(("rename", "unlink")):
            call = (name, QUOTED.findall(body))
        else:
            continue
        if body.endswith("<unfinished ...>"):
            pending[pid] = call
        elif "= -1" not in body:
            found.append(call)
    return found


def first(events: list[tuple[str, list[str]]], test, start: int = 0) -> int:
    return next(i for i in range(start, len(events)) if test(*events[i]))


def is_flush(call: str) -> bool:
    return call in ("fsync", "fdatasync")


def test_submit_flushes_its_tickets_before_they_appear_and_the_queue_after(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"jobs.batch_size": 2})   # 5 jobs: entries of 2, 2 and 1
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": i}} for i in range(5)])
    result = traced([sys.executable, "-c", "from orchestrator.cli import main; main()", "submit", str(paths.root),
                     str(tasks)], tmp_path / "trace")
    assert result.returncode == 0, result.stderr
    events = calls(tmp_path / "trace")
    queue = str(paths.init_queue)
    into_queue = [i for i, (c, p) in enumerate(events) if c.startswith("rename") and p[-1].startswith(queue + "/")]
    assert len(into_queue) == 3
    assert sorted(n.rsplit("-", 1)[-1] for n in os.listdir(queue)) == ["0000", "0000+2", "0000+2"]
    synced = first(events, lambda c, p: c == "syncfs")
    assert synced < into_queue[0], "tickets must be on disk before any of them is queued"
    assert first(events, lambda c, p: is_flush(c) and p == [queue], into_queue[-1]) > into_queue[-1]
    record = first(events, lambda c, p: c.startswith("rename") and p[-1].startswith(str(paths.submissions) + "/"))
    assert any(is_flush(c) and p and p[0].endswith(Path(events[record][1][0]).name) for c, p in events[:record])
    assert any(is_flush(c) and p == [str(paths.submissions)] for c, p in events[record:])


def test_a_shard_is_flushed_file_and_directory_before_its_tickets_are_dropped(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"shards.max_rows": 4})
    from orchestrator.submission.submit import submit_file

    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": i}} for i in range(10)]))
    worker = subprocess.Popen(["strace", "-f", "-y", "-s", "4096", "-qq", "-e", f"trace={CALLS}", "-o",
                               str(tmp_path / "trace"), sys.executable, "-m", "orchestrator.worker", str(paths.root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from tests.core.util import wait_drained

        wait_drained(paths, timeout=120)
        request_stop(paths)
        assert worker.wait(timeout=120) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    events = calls(tmp_path / "trace")
    shards = str(paths.shards)
    names = shard_names(paths)
    assert names
    for name in names:
        renamed = first(events, lambda c, p: c.startswith("rename") and p[-1] == f"{shards}/{name}")
        staged = events[renamed][1][0]
        assert any(is_flush(c) and p == [staged] for c, p in events[:renamed]), f"{name}: not flushed before its rename"
        dir_synced = first(events, lambda c, p: is_flush(c) and p == [shards], renamed)
        for job in (row["job_id"] for row in read_shard(paths.shards / name)):
            # its own ticket, or the batch file standing for it (orchestrator/spool/batches.py)
            dropped = first(events, lambda c, p: c.startswith("unlink") and bool(p) and str(paths.active) in p[-1]
                            and (p[-1].endswith(f"/{job}") or may_hold_job(p[-1].rsplit("/", 1)[-1], job)))
            assert dropped > dir_synced, f"ticket {job} dropped before shard {name} was durable"
    # every ticket written is flushed before its rename (heartbeats excepted: they are not state)
    for i, (call, path) in enumerate(events):
        if call.startswith("rename") and path[0].startswith(str(paths.tmp) + "/.") and "/workers/" not in path[-1]:
            assert any(is_flush(c) and p == [path[0]] for c, p in events[:i]), f"{path[-1]} renamed unflushed"
    counters = orjson.loads(next(paths.workers.glob("gone/*.json")).read_bytes())["fs_ops"]
    assert counters["fsync"] > 0 and counters["fsync_dir"] >= len(names)

"""The registry lock: a stale lock is broken by exactly one writer, so no update is ever lost."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.paths import SpoolPaths

WRITERS = 8
ROUNDS = 15


def add_backend(root: str, index: int, start: "multiprocessing.synchronize.Barrier") -> None:
    start.wait()
    BackendRegistry.of(root).add(f"http://node{index}:8000/v1")


def test_concurrent_writers_breaking_a_stale_lock_lose_no_update(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    lost = []
    for round_ in range(ROUNDS):
        paths = SpoolPaths.of(tmp_path / f"run{round_}")
        paths.root.mkdir()
        paths.backends_lock.write_text("left by a writer that crashed")
        old = time.time() - 3600
        os.utime(paths.backends_lock, (old, old))
        start = context.Barrier(WRITERS)
        writers = [context.Process(target=add_backend, args=(str(paths.root), i, start)) for i in range(WRITERS)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(60)
        assert [w.exitcode for w in writers] == [0] * WRITERS
        registered = {b.url for b in BackendRegistry.of(paths).read().backends}
        lost += [f"round {round_}: node{i}" for i in range(WRITERS) if f"http://node{i}:8000/v1" not in registered]
    assert not lost, f"updates lost: {lost}"

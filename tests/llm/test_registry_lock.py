"""The registry lock: a stale lock is broken by exactly one writer, so no update is ever lost."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from orchestrator.llm import registry
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.lease import try_lock
from orchestrator.spool.paths import SpoolPaths

WRITERS = 8
ROUNDS = 15


def add_backend(root: str, index: int, start: "multiprocessing.synchronize.Barrier") -> None:
    start.wait()
    BackendRegistry.of(root).add(f"http://node{index}:8000/v1")


def test_concurrent_writers_breaking_a_stale_lock_lose_no_update(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "STALE_LOCK_S", 0.3)   # the writers (forked) judge the dead one's lock quickly
    context = multiprocessing.get_context("fork")
    lost = []
    for round_ in range(ROUNDS):
        paths = SpoolPaths.of(tmp_path / f"run{round_}")
        paths.root.mkdir()
        assert try_lock(paths.backends_lock, holder="a-writer-that-crashed") is not None   # and never released
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

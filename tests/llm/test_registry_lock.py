"""The registry lock: a stale lock is broken by exactly one writer, so no update is ever lost."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from orchestrator.llm import registry, registry_file
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.lease import release_any, try_lock
from orchestrator.spool.paths import SpoolPaths

WRITERS = 8
ROUNDS = 15


def add_backend(root: str, index: int, start: "multiprocessing.synchronize.Barrier") -> None:
    start.wait()
    BackendRegistry.of(root).add(f"http://node{index}:8000/v1")


def test_concurrent_writers_breaking_a_stale_lock_lose_no_update(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_file, "STALE_LOCK_S", 0.3)   # the writers (forked) judge the dead one's lock quickly
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


def test_a_writer_paused_past_the_lock_staleness_does_not_overwrite_the_writes_made_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer paused (SIGSTOP, a loaded node, a slow fsync) while it holds the lock has its lock
    broken; the writer that took it over adds a backend. The paused one, resumed, must not write
    the registry it read before the pause: it finds its lock gone and does its change again."""
    paths = SpoolPaths.of(tmp_path / "run")
    paths.root.mkdir()
    first = BackendRegistry.of(paths)
    first.add("http://node0:8000/v1")
    read_for_writing = BackendRegistry._read_for_writing
    paused = []

    def read_then_pause(self: BackendRegistry) -> registry.Snapshot:
        snapshot = read_for_writing(self)
        if not paused:   # the pause: a peer judges our lock stale, breaks it and writes
            paused.append(snapshot)
            release_any(paths.backends_lock)
            BackendRegistry.of(paths).add("http://node2:8000/v1")
        return snapshot

    monkeypatch.setattr(BackendRegistry, "_read_for_writing", read_then_pause)
    first.add("http://node1:8000/v1")
    assert paused, "the pause was not simulated"
    registered = {b.url for b in BackendRegistry.of(paths).read().backends}
    assert registered == {f"http://node{i}:8000/v1" for i in range(3)}

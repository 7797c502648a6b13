"""Node-local locks are filelock's (the kernel frees them when the holder dies); cross-node
locks are spool/lease.py's (tests/core/test_lease.py)."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest


def build_slowly(directory: Path) -> None:
    with open(os.environ["BUILDS_LOG"], "a") as log:
        log.write("built\n")
    time.sleep(0.3)
    (directory / "config.json").write_text("{}")
    (directory / "tokenizer.json").write_text("{}")


def ask_for_the_model(start: "multiprocessing.synchronize.Barrier") -> None:
    from orchestrator.devserver.tiny_model import cached_model

    start.wait()
    assert (cached_model("test-recipe", build_slowly) / "config.json").is_file()


def test_a_node_local_cache_is_built_once_by_processes_asking_at_once(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Node-local locks are filelock's (the kernel frees them when the holder dies): the tiny model,
    asked for by four processes of one node at once, is built once (each built its own before)."""
    monkeypatch.setenv("HPC_ROLLOUT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BUILDS_LOG", str(tmp_path / "builds.log"))
    context = multiprocessing.get_context("fork")
    start = context.Barrier(4)
    askers = [context.Process(target=ask_for_the_model, args=(start,)) for _ in range(4)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(60)
    assert [a.exitcode for a in askers] == [0] * 4
    assert (tmp_path / "builds.log").read_text() == "built\n"

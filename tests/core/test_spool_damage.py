"""`status` and `report` say what is missing from a run instead of reading it as nothing (issue 39:
a deleted shard showed 8 of 9 jobs finished and no warning; a deleted queue/, workers/,
shards/.writers or events/ went unnoticed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from orchestrator.report.model import load_report
from orchestrator.spool.quarantine import quarantine_shard
from orchestrator.spool.shardlog import shard_names
from orchestrator.submission.submit import submit_rows
from tests.core.util import FAST, cli, drain_with_a_worker, make_run


def test_a_deleted_shard_and_deleted_directories_are_warned_of(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{**FAST, "shards.max_rows": 1, "pools.run": 1})
    submit_rows(paths, [(n, {"handler": "sleep", "instance": {"run": 0.3}}) for n in range(6)])
    drain_with_a_worker(paths)
    names = shard_names(paths)
    assert len(names) >= 3, names
    before = json.loads(cli("status", str(paths.root), "--json").stdout)
    assert before["warnings"] == [], before["warnings"]

    (paths.shards / names[1]).unlink()                 # a shard between two others
    shutil.rmtree(paths.events)
    shutil.rmtree(paths.shards / ".writers")
    status = json.loads(cli("status", str(paths.root), "--json").stdout)
    warned = " | ".join(status["warnings"])
    assert f"1 shard(s) deleted from shards/ (not quarantined): {names[1]}" in warned, warned
    assert "events/ is missing" in warned and "shards/.writers/ is missing" in warned, warned
    text = cli("status", str(paths.root)).stdout + cli("status", str(paths.root)).stderr
    assert names[1] in text and "events/ is missing" in text, text
    skipped = " | ".join(load_report(paths).skipped)
    assert names[1] in skipped and "events/ is missing" in skipped, skipped


def test_a_quarantined_shard_is_not_called_deleted(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{**FAST, "shards.max_rows": 1, "pools.run": 1})
    submit_rows(paths, [(n, {"handler": "sleep", "instance": {"run": 0.3}}) for n in range(4)])
    drain_with_a_worker(paths)
    name = shard_names(paths)[0]
    quarantine_shard(paths, name, "torn")    # as a trainer's tail does with an unreadable shard
    status = json.loads(cli("status", str(paths.root), "--json").stdout)
    assert not [w for w in status["warnings"] if "deleted" in w], status["warnings"]
    assert any("quarantined" in w for w in status["warnings"]), status["warnings"]

"""Poison data: a row that cannot be encoded ends as a `failed` row; it never kills a worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.util import cli, make_run, rows, write_jsonl
from tests.faults.fake_vllm import FakeVLLM
from tests.faults.helpers import chat_task, register

pytest.importorskip("torch")  # the chat handler's tokenizer is the tiny model's


def test_a_token_id_out_of_range_fails_its_job_not_the_workers(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    with FakeVLLM(mode="poison") as server:
        register(paths, server.url)
        cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [chat_task(1), chat_task(2)])))
        done = cli("launch", str(paths.root), "--local", "--workers", "2", "--wait", check=False, timeout=300)
    assert "exit codes [0, 0]" in done.stdout + done.stderr, done.stdout + done.stderr
    got = rows(paths)
    assert sorted(r["status"] for r in got) == ["failed", "failed"]
    for row in got:
        assert row["error_stage"] == "commit"
        assert "cannot be stored" in row["error"] and "3000000000" in row["error"], row["error"]
        assert row["response_ids"] is None  # the poison itself is not in the row...
    quarantined = sorted(p.name for p in paths.quarantine.iterdir())
    assert any(n.endswith(".reason") for n in quarantined) and len(quarantined) == 4  # ...but kept aside
    assert not [p for d in paths.active.iterdir() for p in d.iterdir()], "no claim may stay behind"

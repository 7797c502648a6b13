"""Backend outages: a short one costs time, not tasks; a long one fails tasks with its cause; a
backend that hangs while its /health still answers is found in seconds, not a quarter hour."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from orchestrator.llm.registry import BackendRegistry, BackendState
from orchestrator.submission.submit import submit_file
from tests.core.util import drain_with_a_worker, make_run, rows, start_worker, stop_worker, wait_drained, write_jsonl
from tests.faults.fake_vllm import FakeVLLM
from tests.faults.helpers import chat_task, register

pytest.importorskip("torch")  # the chat handler's tokenizer is the tiny model's


def run_chats(paths, tmp_path: Path, count: int, timeout: float = 180) -> None:
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [chat_task(i) for i in range(count)]))
    drain_with_a_worker(paths, timeout=timeout)


def test_tasks_started_during_a_short_outage_wait_for_the_backend(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    server = FakeVLLM().start()
    try:
        register(paths, server.url)
        server.stop()  # down before any task starts
        comeback = threading.Timer(4.0, server.start)
        comeback.start()
        run_chats(paths, tmp_path, 3)
        comeback.join()
    finally:
        server.stop()
    got = rows(paths)
    assert [r["status"] for r in got] == ["ok"] * 3, [r["error"] for r in got]


def test_an_outage_longer_than_the_wait_fails_tasks_with_the_cause(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"llm.outage_wait_s": 2.0})
    server = FakeVLLM().start()
    register(paths, server.url)
    server.stop()  # and never back
    run_chats(paths, tmp_path, 2)
    for row in rows(paths):
        assert row["status"] == "failed"
        assert "NoBackendAvailable" in row["error"] and "waited" in row["error"]
        assert "connect" in row["error"].lower(), f"the cause is missing: {row['error']}"


def test_a_hung_backend_that_answers_health_is_marked_down_within_the_request_timeout(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"llm.request_timeout_s": 2.0, "llm.outage_wait_s": 3.0})
    with FakeVLLM(mode="hang") as server:
        register(paths, server.url)
        run_chats(paths, tmp_path, 1, timeout=120)  # the old defaults took up to 15 minutes
        [backend] = BackendRegistry.of(paths).read().backends
    [row] = rows(paths)
    assert row["status"] == "failed" and "no answer within 2" in row["error"], row["error"]
    assert backend.state is BackendState.DOWN and "no answer within" in backend.reason


def test_a_trickling_backend_is_given_up_within_the_request_timeout_plus_a_second() -> None:
    """One byte a second never trips a per-read timeout: the deadline is for the whole request."""
    import asyncio
    import time

    from orchestrator.llm.client import RetryPolicy
    from orchestrator.llm.http import BackendHttp
    from orchestrator.llm.errors import BackendFailed
    from orchestrator.llm.protocol_clients import client_for
    from orchestrator.llm.registry import Backend

    async def ask(url: str) -> float:
        async with BackendHttp() as http:
            client = client_for(Backend(url=url, model="fake"), http, RetryPolicy(timeout_s=2.0))
            await client.model_info()   # answered at once; only the generation trickles
            started = time.monotonic()
            with pytest.raises(BackendFailed, match="no answer within 2 s"):
                await client.generate([1, 2, 3], {"max_tokens": 4})
            return time.monotonic() - started

    with FakeVLLM(mode="trickle") as server:
        elapsed = asyncio.run(ask(server.url))
    assert elapsed <= 2.0 + 1.0, f"gave up after {elapsed:.1f} s"


def test_a_trickling_backend_is_marked_down_and_its_job_does_not_wait_out_its_budget(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"llm.request_timeout_s": 2.0, "llm.outage_wait_s": 3.0})
    with FakeVLLM(mode="trickle") as server:
        register(paths, server.url)
        run_chats(paths, tmp_path, 1, timeout=120)
        [backend] = BackendRegistry.of(paths).read().backends
    [row] = rows(paths)
    assert row["status"] == "failed" and "no answer within 2 s" in row["error"], row["error"]
    assert backend.state is BackendState.DOWN and "no answer within" in backend.reason
    assert row["run_s"] < 20, f"the job waited {row['run_s']:.0f} s on a backend that trickles"


def test_a_truncated_registry_is_an_outage_quarantined_until_backend_add_rebuilds_it(tmp_path: Path) -> None:
    import json
    import time

    from tests.core.util import cli, wait_until
    from tests.faults.helpers import tiny_tokenizer

    paths = make_run(tmp_path / "run")   # outage_wait_s: the default 300 s
    with FakeVLLM() as server:
        register(paths, server.url)
        whole = paths.backends.read_bytes()
        paths.backends.write_bytes(whole[: len(whole) // 2])   # cut by a full disk, a bad copy, an editor
        submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [chat_task(i) for i in range(3)]))
        worker = start_worker(paths)
        try:
            wait_until(lambda: any(paths.quarantine.glob("backends.json.*.reason")), 60, "the registry quarantined")
            time.sleep(2.0)
            assert rows(paths) == [], "jobs failed instead of waiting for a registry"
            cli("backend", "add", str(paths.root), server.url, "--model", "fake", "--tokenizer", str(tiny_tokenizer()))
            wait_drained(paths, timeout=120)
        finally:
            assert stop_worker(worker) == 0
    assert [r["status"] for r in rows(paths)] == ["ok"] * 3, [r["error"] for r in rows(paths)]
    [note] = paths.quarantine.glob("backends.json.*.reason")
    assert "corrupt" in note.read_text() and "backend add" in note.read_text(), note.read_text()
    assert note.with_suffix("").read_bytes() == whole[: len(whole) // 2], "the bad file is kept as it was"
    noted = [json.loads(line) for f in paths.events.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert any(e["event"] == "registry_quarantined" for e in noted)

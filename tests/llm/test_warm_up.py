"""A worker loads the policy's tokenizer before its first RUN, not inside it (issue 39: ~33 s of
worker and tokenizer warm-up passed inside a job's RUN time and counted against its budget)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.devserver.local_server import local_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.events import events_named
from orchestrator.submission.submit import submit_rows
from tests.core.util import FAST, cli, make_run, start_worker, stop_worker, wait_drained

CHAT = {"handler": "chat", "instance": {"messages": [{"role": "user", "content": "Hello there."}]}}


def test_the_tokenizer_is_loaded_before_the_first_run_and_the_warm_up_is_reported(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **FAST)
    with local_server() as url:
        BackendRegistry.of(paths).add(url, version=0)   # no tokenizer named: the worker asks the server's model
        submit_rows(paths, [(n, CHAT) for n in range(2)], sampling={"max_tokens": 4})
        worker = start_worker(paths)
        try:
            wait_drained(paths, timeout=180)
            status = json.loads(cli("status", str(paths.root), "--json").stdout)
        finally:
            assert stop_worker(worker) == 0
    (warmed,) = events_named(paths, "worker_warmed")
    assert warmed["tokenizers"] == 1 and warmed["seconds"] > 0, warmed
    first_run = min(event["t"] for event in events_named(paths, "run_started"))
    assert warmed["t"] < first_run, "a job's RUN started before the worker had loaded the tokenizer"
    (worker_info,) = status["workers"]
    assert worker_info["warm_up_s"] == warmed["seconds"], worker_info
    from orchestrator.report.model import load_report
    from orchestrator.report.summary import summary_pairs

    said = dict(summary_pairs(load_report(paths)))["worker warm-up"]   # the report says it apart, too
    assert "over 1 worker(s)" in said and "in no job's RUN time" in said, said

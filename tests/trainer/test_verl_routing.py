"""Which handler a verl row goes to, and why, logged once per data_source; checked against submit's choice.

The issue this answers: rows with `data_source: math` went to the `math` handler (a handler of that
name wins over `hpc_rollout.handler`) and nobody was told. `route` explains the rule of
orchestrator/submission/submit.py; the test submits the same rows to a real run and compares.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestrator.handler_api.contract import available_handlers
from orchestrator.spool.batches import queued_tickets
from orchestrator.submission.submit import submit_rows
from orchestrator.trainer.verl.routing import RouteLog, route
from tests.core.util import make_run

SOURCES = ("openai/gsm8k", "mine/arith", "math", "lighteval/MATH")


def verl_row(data_source: str) -> dict[str, object]:
    return {"data_source": data_source, "prompt": [{"role": "user", "content": "What is 3 + 4?"}],
            "reward_model": {"ground_truth": "7"}, "extra_info": {"index": 0}}


def test_the_route_and_its_reason_are_the_handler_submit_chooses(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"data_sources.openai/gsm8k": "math", "data_sources.mine/arith": "math"})
    mapped = {"mine/arith": "answer"}                 # hpc_rollout.source_handlers, over run.toml
    run_sources = {"openai/gsm8k": "math", "mine/arith": "math"}
    report = submit_rows(paths, enumerate((verl_row(s) for s in SOURCES), 1), handler="answer", source_handlers=mapped)
    assert not report.rejected, report.rejected
    chosen = {t.job.data_source: t.job.handler for t in queued_tickets(paths.init_queue)}
    routes = {s: route(s, mapped, run_sources, set(available_handlers()), "answer") for s in SOURCES}
    assert {s: r.handler for s, r in routes.items()} == chosen == {
        "openai/gsm8k": "math", "mine/arith": "answer", "math": "math", "lighteval/MATH": "answer"}
    assert routes["openai/gsm8k"].line() == "data_source 'openai/gsm8k' -> handler 'math' (run.toml [data_sources])"
    assert routes["mine/arith"].line() == ("data_source 'mine/arith' -> handler 'answer' "
                                           "(hpc_rollout.source_handlers, over run.toml's 'math')")
    assert routes["math"].line() == (
        "data_source 'math' -> handler 'math' (a handler of that name, before hpc_rollout.handler 'answer'; "
        "to change it: +hpc_rollout.source_handlers={math: HANDLER})")
    assert routes["lighteval/MATH"].line() == ("data_source 'lighteval/MATH' -> handler 'answer' (hpc_rollout.handler: "
                                               "no mapping, no handler of that name)")
    assert route("x/y", {}, {}, {"answer"}, None).handler is None            # submit refuses it, naming the fix


def test_each_source_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    routes = RouteLog(logging.getLogger("tests.routing"))
    with caplog.at_level(logging.INFO, logger="tests.routing"):
        for _ in range(3):
            routes.note(["math", "openai/gsm8k", "math"], {}, {"openai/gsm8k": "answer"}, "answer")
    assert [r.getMessage() for r in caplog.records] == [
        "hpc-rollout: data_source 'math' -> handler 'math' (a handler of that name, before hpc_rollout.handler "
        "'answer'; to change it: +hpc_rollout.source_handlers={math: HANDLER})",
        "hpc-rollout: data_source 'openai/gsm8k' -> handler 'answer' (run.toml [data_sources])"]

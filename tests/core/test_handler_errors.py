"""A handler's exception tells its author where it happened: the row, `inspect` and the log."""

from __future__ import annotations

import inspect as pyinspect
import logging
from pathlib import Path
from typing import Any

import pytest

from orchestrator.handler_api import contract as handler_module
from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.submission.submit import submit_file
from tests.core.util import cli, make_run, rows, serve_in_process, write_jsonl


class Buggy(AgentHandler):
    name = "buggy"

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        settings: dict[str, str] = {}
        return {"value": settings["x"]}  # the bug

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0}


BUG_LINE = next(n for n, line in enumerate(pyinspect.getsourcelines(Buggy.run)[0], Buggy.run.__code__.co_firstlineno)
                if "the bug" in line)


def test_the_row_inspect_and_the_log_name_the_line_that_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    handler_module._loaded["buggy"] = Buggy
    try:
        paths = make_run(tmp_path / "run")
        report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "buggy", "instance": {}}]))
        with caplog.at_level(logging.INFO):
            serve_in_process(paths)
    finally:
        handler_module._loaded.pop("buggy", None)
    where = f"{Path(__file__).name}:{BUG_LINE} in run"
    [row] = rows(paths)
    assert row["status"] == "failed" and row["error"].startswith("KeyError: 'x'") and where in row["error"], row["error"]
    shown = cli("inspect", str(paths.root), report.first_job).stdout
    assert "Traceback" in shown and f'line {BUG_LINE}, in run' in shown and 'settings["x"]' in shown, shown
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records if report.first_job in r.getMessage())
    assert f"line {BUG_LINE}, in run" in logged, logged

"""A row's token columns agree or the job fails: `response_mask` and `logprobs` have one entry per
response token, the mask is 0 or 1, log-probabilities are finite and at most 0. A handler that
breaks this (a user's handler, a harness's proxy record) would otherwise commit an `ok` row that
crashes a trainer steps later, or trains on tokens shifted against their log-probs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator.handler_api import contract as handler_module
from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.spool.token_columns import token_columns_problem
from orchestrator.submission.submit import submit_file
from tests.core.util import make_run, rows, serve_in_process, write_jsonl


class GivenColumns(AgentHandler):
    """Returns the token columns its instance holds (this test's handler only)."""

    name = "given_columns"

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        return dict(ctx.job.instance["columns"])

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0}


GOOD = {"prompt_ids": [1, 2], "response_ids": [3, 4, 5], "response_mask": [1, 0, 1], "logprobs": [-0.5, 0.0, -1.5]}
BAD = {
    "a log-prob short": ({**GOOD, "logprobs": [-0.5, -1.5]}, "logprobs has 2 entries for 3 response_ids"),
    "a mask long": ({**GOOD, "response_mask": [1, 0, 1, 1]}, "response_mask has 4 entries for 3 response_ids"),
    "a mask of 2": ({**GOOD, "response_mask": [1, 2, 1]}, "response_mask[1] = 2"),
    "a NaN log-prob": ({**GOOD, "logprobs": [-0.5, math.nan, -1.5]}, "logprobs[1] = nan"),
    "a positive log-prob": ({**GOOD, "logprobs": [-0.5, 0.0, 2.0]}, "logprobs[2] = 2.0"),
    "a list in the mask": ({**GOOD, "response_mask": [1, [0], 1]}, "response_mask[1] = [0]"),
    "an infinite log-prob": ({**GOOD, "logprobs": [-0.5, -math.inf, -1.5]}, "logprobs[1] = -inf"),
    "a text log-prob": ({**GOOD, "logprobs": [-0.5, "low", -1.5]}, "logprobs[1] = 'low'"),
    "a float id": ({**GOOD, "response_ids": [3, 4.0, 5]}, "response_ids[1] = 4.0"),
    "a text id": ({**GOOD, "prompt_ids": ["1", 2]}, "prompt_ids[0] = '1'"),
    "a mask without ids": ({"response_mask": [1, 1]}, "response_mask has 2 entries for 0 response_ids"),
}


def test_agreeing_columns_and_rows_without_tokens_pass() -> None:
    assert token_columns_problem(GOOD) is None
    assert token_columns_problem({"prompt_ids": [1], "response_ids": [2, 3]}) is None   # mask and log-probs optional
    assert token_columns_problem({"reward": 1.0}) is None                                # a handler without an LLM
    assert token_columns_problem({**GOOD, "logprobs": [], "response_mask": []}) is None  # empty: not given
    assert token_columns_problem({**GOOD, "logprobs": [-0.5, 0.0, 1e-6]}) is None         # float32 rounding of 0
    assert token_columns_problem({**GOOD, "logprobs": [-1e308, 0.0, -1e308]}) is None     # only their sum overflows


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_disagreement_is_named(case: str) -> None:
    columns, named = BAD[case]
    problem = token_columns_problem(columns)
    assert problem is not None and named in problem, problem


def test_a_job_whose_columns_disagree_fails_with_the_cause_and_keeps_what_it_returned(tmp_path: Path) -> None:
    handler_module._loaded[GivenColumns.name] = GivenColumns
    try:
        paths = make_run(tmp_path / "run")
        tasks = [{"handler": GivenColumns.name, "instance": {"columns": GOOD}}]
        tasks += [{"handler": GivenColumns.name, "instance": {"columns": columns}} for columns, _ in BAD.values()]
        # NaN and infinities are not JSON: a task file cannot carry those cases (the checks above do)
        tasks = [t for t in tasks if not any(isinstance(v, float) and not math.isfinite(v)
                                             for v in t["instance"]["columns"].get("logprobs", []))]
        submit_file(paths, write_jsonl(tmp_path / "t.jsonl", tasks))
        serve_in_process(paths)
    finally:
        handler_module._loaded.pop(GivenColumns.name, None)
    found = sorted(rows(paths), key=lambda r: r["job_id"])
    assert len(found) == len(tasks)
    good, *bad = found
    assert good["status"] == "ok" and good["error"] is None and list(good["logprobs"]) == GOOD["logprobs"]
    for row, task in zip(bad, tasks[1:]):
        assert row["status"] == "failed", row
        assert row["error"].startswith("TokenColumnsError: "), row["error"]
        assert "the handler's row" in row["error"] and "given_columns" in row["error"], row["error"]
        assert row["response_ids"] is None and row["logprobs"] is None   # nothing a trainer could pick up
        assert json.loads(row["result"])["token_columns_refused"] == task["instance"]["columns"]   # kept, as given
        assert row["reward"] == 1.0

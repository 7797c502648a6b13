"""The knobs of long-horizon agents refuse bad values with a message naming the valid ones:
staleness (run.toml, submit, the API), the context policy, the turn reward cap, turn_rewards."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.agent.context import ContextMode, ContextPolicy
from orchestrator.config import ConfigError, RunConfig
from orchestrator.spool.turn_columns import TurnRewardsError, checked_turn_rewards, turn_spans
from orchestrator.submission.submit import SubmitError, submit_rows
from orchestrator.trainer import GroupBatcher
from orchestrator.trainer.api import Spool
from tests.core.util import cli, write_jsonl


def test_staleness_is_checked_in_run_toml_submit_and_the_cli(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="trainer.staleness = 'sometimes'; valid: restart, continue"):
        RunConfig.from_dict({"trainer": {"staleness": "sometimes"}})
    assert RunConfig.from_dict({"trainer": {"staleness": "continue"}}).trainer.staleness == "continue"
    spool = Spool.create(tmp_path / "run", **{"trainer.staleness": "continue"})
    with pytest.raises(SubmitError, match="staleness 'later' is not valid; use one of restart, continue"):
        submit_rows(spool.paths, enumerate([{}], 1), handler="echo", staleness="later")
    report = spool.submit([{}], handler="echo")                       # the run's default
    explicit = spool.submit([{}], handler="echo", staleness="restart")
    tickets = {p.name: p.read_text() for p in spool.paths.init_queue.iterdir()}
    assert any('"staleness":"continue"' in t.replace(" ", "") for n, t in tickets.items() if n.startswith(report.first_job))
    assert any('"staleness":"restart"' in t.replace(" ", "") for n, t in tickets.items() if n.startswith(explicit.first_job))
    refused = cli("submit", str(spool.paths.root), str(write_jsonl(tmp_path / "t.jsonl", [{}])), "--handler", "echo",
                  "--staleness", "never", check=False)
    assert refused.returncode == 2 and "'never' is not one of 'restart', 'continue'" in refused.stderr


def test_context_policy_settings() -> None:
    base = ContextPolicy()
    policy = ContextPolicy.parse(base, {"mode": "summarize", "keep_turns": 2, "summary_tokens": 64})
    assert (policy.mode, policy.keep_turns, policy.summary_tokens) == (ContextMode.SUMMARIZE, 2, 64)
    assert policy.budget(4096) == 4096 - 64 - 128 and ContextPolicy(ContextMode.DROP, 1000).budget(4096) == 1000
    for bad, message in [({"mode": "squash"}, "choose one of none, drop, summarize"),
                         ({"keep": 2}, "unknown context setting 'keep'; valid: mode, budget_tokens"),
                         ({"keep_turns": -1}, r"keep_turns=-1 must be a whole number in \[0, 1000\]"),
                         ({"summarize_tool": "yes"}, "summarize_tool must be true or false"),
                         ("drop", "context must be an object")]:
        with pytest.raises(ValueError, match=message):
            ContextPolicy.parse(base, bad)


def test_turn_reward_checks() -> None:
    assert checked_turn_rewards([1, None, 0.5], 3) == [1.0, None, 0.5]
    for bad, message in [([1.0], "1 entries for 2 turn"), ("0.5", "must be a list"),
                         ([float("nan"), 1], r"turn_rewards\[0\] = nan is not a finite number"),
                         ([True, 1], r"turn_rewards\[0\] = True")]:
        with pytest.raises(TurnRewardsError, match=message):
            checked_turn_rewards(bad, 2)
    with pytest.raises(ValueError, match="turn_reward_cap -1 must be a positive number"):
        GroupBatcher(turn_reward_cap=-1)


def test_turn_spans_place_each_turn_by_its_ids() -> None:
    turns = [{"input_ids": [1, 2], "output_ids": [3, 4], "policy_version": 0},
             {"input_ids": [1, 2, 3, 4, 9], "output_ids": [5], "policy_version": 1},
             {"input_ids": [7, 7], "output_ids": [8], "policy_version": 1}]        # another context
    assert turn_spans([1, 2], [3, 4, 9, 5], turns) == [
        {"start": 0, "end": 2, "policy_version": 0}, {"start": 3, "end": 4, "policy_version": 1}, None]
    assert turn_spans([1, 2], [3, 4, 9, 6], turns)[1] is None      # output ids not where the turn says
    assert turn_spans([1, 2], [3, 4], None) is None

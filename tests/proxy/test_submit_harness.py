"""`submit --handler harness --set harness.KEY=VALUE` through the real CLI: settings reach every
instance, bad ones are refused at submit time with the fix named."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from orchestrator.spool.batches import queued_tickets
from orchestrator.cli import cli
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run


def queued_instances(paths: SpoolPaths) -> list[dict]:
    return [ticket.job.instance for ticket in queued_tickets(paths.init_queue)]


def test_set_fills_the_harness_settings_of_every_row(tmp_path: Path) -> None:
    paths, _ = init_run(tmp_path / "run")
    tasks = tmp_path / "math.jsonl"
    tasks.write_text("".join(json.dumps({"instance_id": f"m{i}", "problem": f"{i} + 1?", "answer": str(i + 1)}) + "\n"
                             for i in range(2)))
    runner = CliRunner()
    missing = runner.invoke(cli, ["submit", str(paths.root), str(tasks), "--handler", "harness"])
    assert missing.exit_code == 1 and "harness.command" in missing.output
    ok = runner.invoke(cli, ["submit", str(paths.root), str(tasks), "--handler", "harness",
                             "--set", "harness.command=python3 agent.py --fast", "--set", "harness.max_calls=5"])
    assert ok.exit_code == 0, ok.output
    instances = queued_instances(paths)
    assert len(instances) == 2
    assert all(i["harness"] == {"command": "python3 agent.py --fast", "max_calls": 5} for i in instances)
    wrong = runner.invoke(cli, ["submit", str(paths.root), str(tasks), "--handler", "harness",
                                "--set", "harness.command=x", "--set", "harness.builder=merged"])
    assert wrong.exit_code == 1 and "prefix_merging" in wrong.output
    malformed = runner.invoke(cli, ["submit", str(paths.root), str(tasks), "--handler", "harness", "--set", "harness"])
    assert malformed.exit_code == 2 and "KEY.PATH=VALUE" in malformed.output


def test_a_cli_by_name_needs_no_command_and_an_unknown_one_names_the_choices(tmp_path: Path) -> None:
    paths, _ = init_run(tmp_path / "run")
    tasks = tmp_path / "math.jsonl"
    tasks.write_text(json.dumps({"instance_id": "m0", "problem": "1 + 1?", "answer": "2"}) + "\n")
    runner = CliRunner()
    ok = runner.invoke(cli, ["submit", str(paths.root), str(tasks), "--handler", "harness", "--set", "harness.cli=codex"])
    assert ok.exit_code == 0, ok.output
    assert [i["harness"] for i in queued_instances(paths)] == [{"cli": "codex"}]
    unknown = runner.invoke(cli, ["submit", str(paths.root), str(tasks), "--handler", "harness",
                                  "--set", "harness.cli=gemini"])
    assert unknown.exit_code == 1 and "claude-code, codex" in unknown.output

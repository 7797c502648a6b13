"""Words a user reads: each message names the problem as it is and the fix that works."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.util import cli, make_run, write_jsonl

COMMANDS_ON_A_RUN = [("status",), ("submit", "{tasks}"), ("launch", "--local"), ("stop",), ("inspect", "JOB"),
                     ("cancel", "--all"), ("tail",), ("report",), ("backend", "list")]


@pytest.mark.parametrize("command", COMMANDS_ON_A_RUN, ids=lambda c: " ".join(c))
def test_a_missing_run_directory_says_how_to_make_one(tmp_path: Path, command: tuple[str, ...]) -> None:
    missing = tmp_path / "nope"
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])
    args = [a.replace("{tasks}", str(tasks)) for a in command[1:]]
    head = command[:1] if command[0] != "backend" else command[:2]
    args = args[1:] if command[0] == "backend" else args
    done = cli(*head, str(missing), *args, check=False)
    assert done.returncode == 2, done.stderr
    assert f"{missing} does not exist" in done.stderr and f"hpc-rollout init {missing}" in done.stderr, done.stderr

"""Words a user reads: each message names the problem as it is and the fix that works."""

from __future__ import annotations

import re
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


def test_a_sampling_value_that_is_not_a_number_says_so(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])
    done = cli("submit", str(paths.root), str(tasks), "--sampling", "temperature=abc", check=False)
    assert done.returncode == 1 and "temperature='abc' is not a number" in done.stderr, done.stderr
    low = cli("submit", str(paths.root), str(tasks), "--sampling", "top_p=0", check=False)
    assert low.returncode == 1 and "top_p=0 is out of range" in low.stderr and "(0, 1]" in low.stderr, low.stderr


def test_unknown_names_get_a_suggestion(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "slep", "instance": {}}])
    done = cli("submit", str(paths.root), str(tasks), check=False)
    assert "unknown handler 'slep' (did you mean 'sleep'?)" in done.stderr, done.stderr
    setting = cli("init", str(paths.root), "--set", "pools.rnu=4", check=False)
    assert setting.returncode == 1 and "unknown setting 'pools.rnu' (did you mean 'pools.run'?)" in setting.stderr


def test_inspect_with_a_bad_id_points_at_a_list_of_job_ids(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    submitted = cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])))
    first = next(word for word in submitted.stdout.split() if word.endswith("-0000"))
    missing = cli("inspect", str(paths.root), first.replace("-0000000-", "-0000009-"), check=False)
    assert missing.returncode == 1 and f"hpc-rollout status {paths.root}" in missing.stderr, missing.stderr
    status = cli("status", str(paths.root)).stdout
    assert first in status, f"status lists the job ids the hint promises:\n{status}"


def test_stage_times_are_printed_for_people(tmp_path: Path) -> None:
    from orchestrator.cli.console import format_seconds

    assert [format_seconds(s) for s in (0.0002607, 0.0412, 3.2, 125, 11040, None)] == \
        ["0.26 ms", "41 ms", "3.20 s", "2 min 05 s", "3 h 04 min", "-"]
    paths = make_run(tmp_path / "run")
    cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}] * 3)))
    cli("launch", str(paths.root), "--local", "--wait", timeout=300)
    shown = cli("status", str(paths.root)).stdout
    assert "time per stage" in shown and " ms " in shown + " " and not re.search(r"\b0\.000\d", shown), shown
    summary = cli("report", str(paths.root), timeout=300).stdout
    stages = summary.split("time per stage", 1)[1]
    assert " ms" in stages and not re.search(r"\b0\.000\d", stages), summary


def test_source_handler_help_says_it_does_not_change_run_toml(tmp_path: Path) -> None:
    text = cli("submit", "--help").stdout
    assert "adds to run.toml" not in text and "run.toml is not changed" in " ".join(text.split()), text
    paths = make_run(tmp_path / "run")
    before = paths.run_config.read_text()
    verl = {"data_source": "my/set", "prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}
    cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [verl])), "--source-handler", "my/set=answer")
    assert paths.run_config.read_text() == before


def test_readme_has_no_stray_fragment_and_no_twice_listed_path() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lines = readme.splitlines()
    fence = [i for i, line in enumerate(lines) if line.strip().startswith("```")]
    for opening, closing in zip(fence[::2], fence[1::2]):
        after = lines[closing + 1] if closing + 1 < len(lines) else ""
        assert after.strip() == "" or after.startswith(("#", "|", "-", "`", "**")), \
            f"README line {closing + 2} runs on from a code block: {after!r}"
    table = readme.split("## The spool", 1)[1].split("```", 2)[1].splitlines()
    listed = [row.split()[0] for row in table if row.strip()]
    assert len(listed) == len(set(listed)), [p for p in listed if listed.count(p) > 1]

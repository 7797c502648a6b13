"""A new run starts readable: `init` writes a commented run.toml and an example task file that runs
as it is; `submit --json` and `launch --json` say what they did in one JSON object (issue 24, item 10)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from orchestrator.config import BOUNDS, RunConfig
from orchestrator.run_toml import HELP, commented_toml, settings_of
from orchestrator.spool.paths import SpoolPaths
from tests.core.util import cli, rows, write_jsonl


def test_every_setting_is_explained_and_the_text_reads_back_the_same() -> None:
    config = RunConfig().with_overrides({"pools.run": 16, "sandbox.image": "/img", "data_sources.openai/gsm8k": "answer"})
    dotted = [f"{section}.{key}" for section, values in settings_of(config) for key, _ in values]
    assert sorted(dotted) == sorted(HELP), "every RunConfig setting has its one line in orchestrator/run_toml.py"
    assert set(BOUNDS) <= set(HELP)
    text = commented_toml(config)
    assert RunConfig.from_dict(tomllib.loads(text)) == config
    lines = text.splitlines()
    for name in ("run", "timeout_s", "outage_wait_s"):
        line = next(i for i, row in enumerate(lines) if row.startswith(f"{name} = "))
        assert lines[line - 1].startswith("# ") and "Default" in lines[line - 1], lines[line - 1]


def test_init_writes_a_commented_run_toml_and_an_example_that_runs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = cli("init", str(run))
    example = run / "example-tasks.jsonl"
    assert example.is_file() and f"hpc-rollout submit {run} {example}" in done.stdout, done.stdout
    toml = (run / "run.toml").read_text()
    assert "# agent loops (RUN stages) at once. Default 8, from 0 to 4096." in toml, toml
    assert RunConfig.load(run / "run.toml") == RunConfig()
    cli("init", str(run), "--set", "pools.run=3")
    assert RunConfig.load(run / "run.toml").pools.run == 3 and "# agent loops" in (run / "run.toml").read_text()
    example.write_text(example.read_text())   # re-init keeps a file the user may have edited
    submitted = cli("submit", str(run), str(example), "--samples", "2", "--json")
    report = json.loads(submitted.stdout)
    assert report["jobs"] == 2 * len(example.read_text().splitlines()) and report["rejected"] == []
    finished = cli("launch", str(run), "--local", "--workers", "2", "--wait", timeout=300)
    assert finished.returncode == 0
    assert {row["status"] for row in rows(SpoolPaths.of(run))} == {"ok"}


def test_submit_json_reports_rejected_rows_with_their_lines(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cli("init", str(run))
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}, "not json",
                                               {"handler": "sleep", "instance": {"run_s": 1}}])
    done = cli("submit", str(run), str(tasks), "--json", check=False)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["jobs"] == 1 and report["first_job"] == report["last_job"] and report["submission_id"]
    assert [r["line"] for r in report["rejected"]] == [2, 3] and "run_s" in report["rejected"][1]["reason"]
    assert f"{tasks}:3" in done.stderr, "the human lines still go to stderr"


def test_launch_json_of_a_slurm_dry_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cli("init", str(run))
    done = cli("launch", str(run), "--nodes", "2", "--dry-run", "--json")
    started = json.loads(done.stdout)
    assert started["where"] == "slurm" and started["dry_run"] is True and started["already_alive"] == []
    [array] = started["arrays"]
    assert array["size"] == 2 and Path(array["script"]).is_file() and started["launch_id"] in started["log_dir"]


def test_launch_wait_json_keeps_standard_output_json(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cli("init", str(run))
    cli("submit", str(run), str(run / "example-tasks.jsonl"))
    done = cli("launch", str(run), "--local", "--wait", "--json", timeout=300)
    started, ended = [json.loads(line) for line in done.stdout.splitlines()]
    assert started["where"] == "local" and len(started["pids"]) == 1 and Path(started["log_dir"]).is_dir()
    assert ended["drained"] is True and ended["exit_code"] == 0 and ended["by_status"] == {"ok": 4}
    assert "drained: 4 ok" in done.stderr

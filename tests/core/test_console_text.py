"""Text from data is printed as it is: file names, handler names, data sources and messages that
hold `[x]`, `[/red]` or `[agents]` reach the user whole on every error path (never read as markup,
never a crash of the print itself)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.handler_api import contract as handler_module
from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.submission.submit import submit_file
from tests.core.util import cli, make_run, rows, serve_in_process, write_jsonl

BRACKETS = ("[x]", "[/red]", "[agents]")
ORCHESTRATOR = Path(__file__).resolve().parents[2] / "orchestrator"


def assert_whole(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    text = result.stdout + result.stderr
    assert "MarkupError" not in text and "internal error" not in text, text
    for needle in needles:
        assert needle in text, f"{needle!r} missing from:\n{text}"


def test_a_rejected_row_names_its_file_and_every_bracketed_word(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run[x]")
    tasks = write_jsonl(tmp_path / "rows[train].jsonl", [
        {"handler": "[/red]", "instance": {}},
        {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+1?"}],
         "reward_model": {"ground_truth": "2"}},
        {"handler": "[agents]", "instance": {}},
        {"handler": "echo", "instance": {}},
    ])
    done = cli("submit", str(paths.root), str(tasks), check=False)
    assert done.returncode == 1
    assert_whole(done, f"{tasks}:1", "'[/red]'", f"{tasks}:2", "[data_sources]", f"{tasks}:3", "'[agents]'")
    assert "rows.jsonl" not in done.stderr
    strict = cli("submit", str(paths.root), str(tasks), "--strict", check=False)
    assert strict.returncode == 1
    assert_whole(strict, f"{tasks}:1", "'[/red]'", "--strict")


def test_a_run_directory_with_brackets_is_named_whole_by_every_command(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run[x][/red][agents]")
    assert_whole(cli("init", run_dir), run_dir)
    tasks = write_jsonl(tmp_path / "t[x].jsonl", [{"handler": "echo", "instance": {"say": "[/red]"}}])
    submitted = cli("submit", run_dir, str(tasks))
    assert_whole(submitted, run_dir)
    assert_whole(cli("status", run_dir), run_dir)
    missing = cli("inspect", run_dir, "nope[/red]", check=False)
    assert missing.returncode == 1
    assert_whole(missing, "nope[/red]")
    launched = cli("launch", run_dir, "--local", "--wait", timeout=300, check=False)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert_whole(launched, run_dir)
    job = json.loads(cli("tail", run_dir).stdout.splitlines()[0])["job_id"]
    assert_whole(cli("inspect", run_dir, job), '"say":"[/red]"')


class Bracketed(AgentHandler):
    name = "bracketed"

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("needs pip install 'hpc-rollout[agents]' [x] [/red]")

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0}


def test_a_failed_job_s_error_is_printed_whole_by_inspect_and_status(tmp_path: Path) -> None:
    handler_module._loaded["bracketed"] = Bracketed
    try:
        paths = make_run(tmp_path / "run")
        report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "bracketed", "instance": {}}]))
        serve_in_process(paths)
    finally:
        handler_module._loaded.pop("bracketed", None)
    [row] = rows(paths)
    assert row["status"] == "failed" and "[agents]' [x] [/red]" in row["error"], row["error"]
    assert_whole(cli("inspect", str(paths.root), report.first_job), "hpc-rollout[agents]' [x] [/red]")
    assert_whole(cli("status", str(paths.root)), "hpc-rollout[agents]' [x] [/red]")


HIDE_MATH_VERIFY = (
    "import importlib.machinery as machinery\n"
    "find = machinery.PathFinder.find_spec.__func__\n"
    "machinery.PathFinder.find_spec = classmethod(lambda cls, name, path=None, target=None: "
    "None if name.split('.')[0] == 'math_verify' else find(cls, name, path, target))\n"
    "from orchestrator.cli import main\n"
    "main()\n"
)


def test_tasks_check_without_math_verify_names_the_extra_once(tmp_path: Path) -> None:
    tasks = write_jsonl(tmp_path / "math[x].jsonl", [{"problem": f"{n} + 1?", "answer": str(n + 1)} for n in range(20)])
    done = subprocess.run([sys.executable, "-c", HIDE_MATH_VERIFY, "tasks", "check", str(tasks), "--handler", "math",
                           "--runtime", "local"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert_whole(done, "pip install 'hpc-rollout[agents]'")
    assert (done.stdout + done.stderr).count("hpc-rollout[agents]") == 1, done.stdout + done.stderr


# -- how the command line prints, checked from its source ---------------------------------------

def _cli_sources() -> list[Path]:
    return sorted((ORCHESTRATOR / "cli").glob("*.py"))


def test_every_console_of_the_command_line_is_the_console_helper_s() -> None:
    """rich parses markup unless told not to: only orchestrator/cli/console.py makes consoles."""
    offenders = []
    for path in _cli_sources():
        if path.name == "console.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Console":
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"consoles made outside cli/console.py: {offenders}"


def test_no_markup_in_the_command_line_s_strings() -> None:
    """Styles are spans the code gives (console.styled), never tags inside text that data joins."""
    offenders = []
    for path in _cli_sources():
        if path.name == "console.py":   # it names the tags it keeps out
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and any(tag in node.value for tag in ("[red]", "[/red]", "[yellow]", "[bold]", "[/")):
                offenders.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    assert not offenders, offenders


ERROR_PATHS = [
    (("cancel", "{run}", "job[/red]"), "job[/red]"),
    (("cancel", "{run}", "--group", "g[x]"), "g[x]"),
    (("tail", "{run}", "--fields", "rew[agents]ard"), "rew[agents]ard"),
    (("submit", "{run}", "{tmp}/missing[agents].jsonl"), "missing[agents].jsonl"),
    (("backend", "add", "{run}", "http://h[/red]:8000/v1"), "h[/red]"),
    (("init", "{run}", "--set", "pools.r[x]=1"), "pools.r[x]"),
    (("handlers", "[/red]"), "'[/red]'"),
    (("inspect", "{run}", "[agents]"), "'[agents]'"),
    (("status", "{tmp}/nowhere[x]"), "nowhere[x]"),
    (("submit", "{run}", "{tmp}/t.jsonl", "--sampling", "temperature=[x]"), "temperature='[x]'"),
    (("submit", "{run}", "{tmp}/t.jsonl", "--source-handler", "[/red]"), "'[/red]'"),
]


def run_main(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> subprocess.CompletedProcess[str]:
    """The console script's main() in this process (through cli/errors.py, as a shell runs it)."""
    from orchestrator.cli import main

    monkeypatch.setattr(sys, "argv", ["hpc-rollout", *args])
    code: int | str | None = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code if isinstance(code, int) else 1, captured.out, captured.err)


def test_every_error_path_prints_bracketed_data_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    paths = make_run(tmp_path / "run[x]")
    write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])
    for command, needle in ERROR_PATHS:
        args = [a.replace("{run}", str(paths.root)).replace("{tmp}", str(tmp_path)) for a in command]
        done = run_main(args, capsys, monkeypatch)
        assert done.returncode in (1, 2), (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        assert_whole(done, needle)

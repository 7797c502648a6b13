"""Claude Code and Codex CLI, installed from npm into the `harness` image, run for real by the
`harness` handler (`harness.cli`) inside bubblewrap sandboxes with no network but the job's proxy,
through real local workers:
  * driven by the scripted backend (a policy that emits the tool calls the fix needs), each applies
    the fix of a bundled SWE task with its own shell tool -> reward 1 from the `swe` family's
    grading; every call's ids are the backend's, the tool observations sit in the masked
    stretches, and prefix_merging merges each CLI's calls into one sample;
  * driven by the random tiny model, each fails cleanly: a row with reward 0 and a stop reason,
    no sandbox, proxy file or CLI process left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.proxy.trajectory import samples_of
from orchestrator.spool.rundir import init_run
from tests.agents.helpers import by_instance, rows, run_workers, submit
from tests.proxy.agent_clis import harness_image_for_tests
from tests.proxy.conftest import needs_bwrap, proxy_leftovers, short_runtime  # noqa: F401
from tests.proxy.jobs import assert_observations_masked, check_fidelity
from tests.proxy.scripts import tool_call
from tests.proxy.test_harness_e2e import events, processes_mentioning
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]

CLIS = ("claude-code", "codex")
# Text each CLI's own system prompt holds: the scripted backend tells their calls apart by it.
PROMPT_MARKS = {"claude-code": "Claude Agent SDK", "codex": "Codex CLI is an open source project"}
SHELL_TOOLS = {"claude-code": ("Bash", "command"), "codex": ("exec_command", "cmd")}
DONE = "The fix is applied."
LIMITS = {"max_calls": 6, "max_context_tokens": 60000, "max_tokens_per_call": 512}


@pytest.fixture(scope="module")
def harness_image() -> Path:
    return harness_image_for_tests()


@pytest.fixture(scope="module")
def swe_row(bundled: Any) -> dict[str, Any]:
    return json.loads(bundled.swe.read_text().splitlines()[0])


def fix_command(swe_row: dict[str, Any]) -> str:
    """The fix, in the repository (each CLI's working directory). Not `cd /workspace/repo && ...`:
    Claude Code drops a `cd` into its working directory from the command it echoes back, so the
    history it sends differs from what the policy sampled and its next call starts a new sample."""
    return "git apply <<'PATCH'\n" + swe_row["patch"].rstrip("\n") + '\nPATCH\necho "applied $((40 + 2))"'


def run_clis(tmp: Path, runtime: Path, image: Path, swe_row: dict[str, Any], server_args: list[str],
             harness: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Each CLI on the SWE task, one job each, through one worker: the rows, the backend's record
    and the run's events."""
    record = tmp / "record.jsonl"
    server = start_server(tiny=True, record=record, extra_args=[*server_args, "--max-model-len", "65536"])
    try:
        paths, _ = init_run(tmp / "run", {"sandbox.image": str(image), "sandbox.runtime": "bwrap",
                                          # the operator lets the SWE rows bind their repository mirrors
                                          "sandbox.allowed_binds": [str(Path(swe_row["repo_mirror"]).parent)],
                                          "shards.idle_flush_s": 0.1, "shards.max_age_s": 0.5})
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=1)
        (tmp / "tasks.jsonl").write_text("".join(json.dumps({
            **swe_row, "instance_id": cli, "harness": {"cli": cli, **LIMITS, **harness}}) + "\n" for cli in CLIS))
        submit(paths, tmp / "tasks.jsonl", "harness")
        run_workers(paths, runtime, workers=1, timeout_s=900)
        assert sandbox_processes(runtime) == [] and proxy_leftovers(runtime) == []
        # only this run's sandboxes: the proxy benchmark's smoke run may be running the same CLIs
        assert processes_mentioning("claude -p", runtime) == [] and processes_mentioning("codex exec", runtime) == []
        found = by_instance(rows(paths))
        happened = events(paths)
    finally:
        server.stop()
    served = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return found, served, happened


@pytest.fixture(scope="module")
def scripted_rows(tmp_path_factory: pytest.TempPathFactory, harness_image: Path, swe_row: dict[str, Any]) -> Any:
    tmp = tmp_path_factory.mktemp("clis")
    scripts = [{"match": "", "replies": [], "after": "I have nothing to add."}]   # any side call of a CLI
    for cli, mark in PROMPT_MARKS.items():
        tool, argument = SHELL_TOOLS[cli]
        scripts.append({"match": mark, "replies": ["I will apply the fix." + tool_call(tool, **{argument: fix_command(swe_row)}),
                                                   DONE]})
    (tmp / "scripts.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scripts))
    runtime = tmp / "rt"
    runtime.mkdir()
    return run_clis(tmp, runtime, harness_image, swe_row, ["--scripted", str(tmp / "scripts.jsonl")], {})


@pytest.mark.parametrize("cli", CLIS)
def test_each_cli_solves_a_bundled_swe_task_through_the_proxy(cli: str, scripted_rows: Any) -> None:
    found, served, happened = scripted_rows
    row = found[cli]
    result = json.loads(row["result"])
    assert (row["status"], row["reward"], row["stop_reason"]) == ("ok", 1.0, "finished"), \
        row["error"] or result.get("harness_log")
    assert result["harness_exit_code"] == 0 and result["resolved"] is True and result["cli"] == cli
    assert result["apis"] == [{"claude-code": "anthropic_messages", "codex": "openai_responses"}[cli]]
    assert result["unserved_endpoints"] == []
    check_fidelity(row, served)
    # The CLI's own loop, and nothing else: the call that applied the fix, then the one that saw its
    # output and ended, merged into one sample (no side call, no rewritten history).
    calls = [e for e in happened if e["event"] == "llm_call" and e["job"] == row["job_id"]]
    assert (len(row["turns"]), result["samples"]) == (2, [[0, 1]]), calls
    (sample,) = samples_of(row)
    assert_observations_masked(sample, _tokenizer(), ["applied 42"])


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from orchestrator.devserver.tiny_model import tiny_model_dir

    return AutoTokenizer.from_pretrained(tiny_model_dir(), local_files_only=True)


def test_each_cli_with_the_random_model_fails_cleanly(tmp_path: Path, short_runtime: Path, harness_image: Path,
                                                      swe_row: dict[str, Any]) -> None:
    found, served, _ = run_clis(tmp_path, short_runtime, harness_image, swe_row, [],
                                {"max_calls": 3, "max_tokens_per_call": 24})
    for cli in CLIS:
        row = found[cli]
        result = json.loads(row["result"])
        assert (row["status"], row["reward"], result["resolved"]) == ("ok", 0.0, False), \
            row["error"] or result.get("harness_log")
        assert all(t["finish_reason"] == "length" for t in row["turns"])   # 24 random tokens, never a call
        check_fidelity(row, served)
    # Claude Code continues a reply cut by max_tokens (each call extends the last) until the call
    # limit refuses the fourth and the command is interrupted.
    claude = found["claude-code"]
    assert (claude["stop_reason"], len(claude["turns"])) == ("max_turns", 3)
    assert json.loads(claude["result"])["samples"] == [[0, 1, 2]]
    # Codex CLI takes a response cut by max_output_tokens (status incomplete) as an error and exits 1.
    codex, codex_result = found["codex"], json.loads(found["codex"]["result"])
    assert (codex["stop_reason"], len(codex["turns"]), codex_result["harness_exit_code"]) == ("error", 1, 1)
    assert "Incomplete response returned, reason: max_output_tokens" in codex_result["harness_log"]

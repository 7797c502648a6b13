"""SpoolLoopManager called with verl's own batch where verl's real fit() cannot go in a test's time.

verl's fit() itself, on the spool's rollouts with verl's FSDP actor (layout accepted, rewards,
GRPO, log-prob honesty, weights after each update): tests/verl/test_fit.py. Here, the manager
alone: verl's batch in (RLHFDataset + collate_fn, _get_gen_batch, repeat(n): one process,
tests/verl/manager_calls.py), what it returns read as it is and through verl's own
compute_response_mask, compute_grpo_outcome_advantage and agg_loss.

Real parts: verl in its own venv (scripts/verl-setup.sh), serve-llm --tiny over HTTP (one server
sampling with processed logprobs, one scripted with a tool call), real worker processes (in
verl's venv where verl's reward functions run at EVAL), bubblewrap sandboxes for the tool task.

Scenarios, one spool each:
  mismatch   the backend registered raw, verl expects processed: refused before anything is queued
  verl_score gsm8k rows scored by verl's default_compute_score at EVAL (scripted replies)
  tool       a multi-turn tool task (`math`: a python tool call, then an answer), verl's math_dapo
  verl_servers verl's LLMServerClient over its own load balancer (a Ray actor) names the server; the
             manager registers it and moves it to each step's policy version
  v1         verl 0.9.1's V1 trainer contract (a TensorDict in, TransferQueue out): refused, naming the fix
  gsm8k_table verl's gsm8k scorer on a table of replies, against `answer`'s rules
  time_limit half the prompts are 10-minute `sleep` jobs: returned at the limit with what finished,
             the rest cancelled and masked
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpc_rollout.handlers.answer import score
from orchestrator.spool import fsops
from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.spool.paths import SpoolPaths
from orchestrator.report.status import pending_count
from tests.core.util import cli, make_run, stop_worker
from tests.verl.env import VerlEnv, verl_env

pytestmark = [pytest.mark.llm, pytest.mark.bwrap]

PROMPTS, N = 4, 4
TIME_LIMIT_S = 20.0
SCRIPTS = [
    {"match": "What is 3 + 4?", "replies": ["So 3 + 4 = 7.\n#### 7"]},
    {"match": "What is 5 + 6?", "replies": ["The answer is 11."]},          # verl's strict rule: 0
    {"match": "What is 17 * 23?", "replies": [
        '<tool_call>{"name": "python", "arguments": {"code": "print(17 * 23)"}}</tool_call>',
        "The product is \\boxed{391}."]},
    {"match": "What is 2 ** 10?", "replies": [
        '<tool_call>{"name": "python", "arguments": {"code": "print(2 ** 10)"}}</tool_call>',
        "It is \\boxed{1000}."]},
    {"match": "", "replies": ["I do not know."]},
]


# `answer`'s rules against verl's own gsm8k scorer: `match: gsm8k` must agree on every row; `number`
# (the default, lenient on purpose) differs exactly where handlers/answer.py says.
#        reply                                  truth   number differs from verl
TABLE = [
    ("So 9 + 63 = 72.\n#### 72",                "72",   False),
    ("The answer is 72.",                       "72",   True),
    ("#### 72.0",                               "72",   True),
    ("#### 72.",                                "72",   True),
    ("#### 1,234",                              "1234", False),
    ("#### $72",                                "72",   True),
    ("####72",                                  "72",   True),
    ("#### 71 (not 72)",                        "72",   False),
    ("#### 72 then #### 73",                    "72",   False),
    ("#### 72" + " and so on" * 40,             "72",   True),
    ("#### -5",                                 "-5",   False),
    ("no answer at all",                        "72",   False),
    ("so 9 + 63 = 72",                          "72",   True),
]


def gsm8k_rows(questions: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": q}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": a},
             "extra_info": {"split": "train", "index": i, "answer": f"#### {a}"}} for i, (q, a) in enumerate(questions)]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def start_verl_worker(verl: VerlEnv, paths: SpoolPaths) -> subprocess.Popen[bytes]:
    return verl.popen("-m", "orchestrator.worker", str(paths.root), "-v", log=paths.root / "worker.log")


def start_main_worker(paths: SpoolPaths) -> subprocess.Popen[bytes]:
    log = open(paths.root / "worker.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "orchestrator.worker", str(paths.root), "-v"], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def nothing_running(paths: SpoolPaths) -> list[str]:
    """Claims still held or jobs still queued (what a returned batch must not leave behind)."""
    held = [p.name for p in paths.root.joinpath("active").glob("*/*") if not p.name.startswith(".")]
    return held + ([f"{pending_count(paths)} pending"] if pending_count(paths) else [])


@pytest.fixture(scope="module")
def verl(tmp_path_factory: pytest.TempPathFactory) -> VerlEnv:
    return verl_env(tmp_path_factory.mktemp("verl-env"))


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalServer]]:
    scripts = tmp_path_factory.mktemp("scripts") / "scripts.json"
    scripts.write_text(json.dumps(SCRIPTS))
    sampling = start_server(threads=1, extra_args=("--logprobs-mode", "processed"))
    try:
        scripted = start_server(threads=1, extra_args=("--scripted", str(scripts), "--logprobs-mode", "processed"))
        try:
            yield {"sampling": sampling, "scripted": scripted}
        finally:
            scripted.stop()
    finally:
        sampling.stop()


@pytest.fixture(scope="module")
def outcome(verl: VerlEnv, servers: dict[str, LocalServer], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("verl-runs")
    model = str(tiny_model_dir())
    common = {"model": model, "n": N, "prompts": PROMPTS, "prompt_length": 96, "response_length": 64,
              "temperature": 0.7, "max_tokens": 24}
    runs = {name: make_run(base / name, **{"shards.max_age_s": 0.3, "shards.idle_flush_s": 0.05})
            for name in ("mismatch", "scripted", "time_limit", "verl_servers")}
    cli("backend", "add", str(runs["mismatch"].root), servers["sampling"].url, "--logprob-mode", "raw")
    cli("backend", "add", str(runs["scripted"].root), servers["scripted"].url)
    cli("backend", "add", str(runs["time_limit"].root), servers["sampling"].url)
    questions = [(f"What is {a} + {b}? Answer with #### N.", str(a + b)) for a, b in ((3, 4), (5, 6), (8, 1), (2, 2))]
    gsm8k = write_parquet(base / "gsm8k.parquet", gsm8k_rows(questions))
    tool_rows = [{"data_source": "math", "prompt": [{"role": "user", "content": q}], "ability": "math",
                  "reward_model": {"style": "rule", "ground_truth": a},
                  "extra_info": {"index": i, "tools_kwargs": {"python": {"create_kwargs": {"ground_truth": a}}}}}
                 for i, (q, a) in enumerate((("What is 17 * 23?", "391"), ("What is 2 ** 10?", "1024")))]
    # even rows: gsm8k questions for `answer` (seconds); odd rows: `sleep` jobs of 10 minutes
    mixed_rows = [{**row, "run": None} if i % 2 == 0 else {**row, "data_source": "sleep", "run": 600.0}
                  for i, row in enumerate(gsm8k_rows(questions))]   # every row has every column (Parquet)
    scenarios = [
        {**common, "name": "mismatch", "run": str(runs["mismatch"].root), "parquet": gsm8k, "handler": "answer"},
        {**common, "name": "verl_score", "run": str(runs["scripted"].root), "parquet": gsm8k, "handler": "answer",
         "reward": "verl"},
        {**common, "name": "tool", "run": str(runs["scripted"].root), "prompts": 2, "n": 2, "response_length": 256,
         "prompt_length": 1024, "max_tokens": 64,
         "parquet": write_parquet(base / "tool.parquet", tool_rows), "reward": "verl"},
        {**common, "name": "verl_servers", "run": str(runs["verl_servers"].root), "parquet": gsm8k,
         "handler": "answer", "prompts": 2, "n": 2, "global_steps": 3, "max_policy_lag": 1,
         "verl_servers": [servers["sampling"].url.removeprefix("http://").removesuffix("/v1")]},
        {**common, "name": "v1", "v1": True, "run": str(runs["mismatch"].root), "parquet": gsm8k},
        {"name": "gsm8k_table", "table": [[reply, truth] for reply, truth, _ in TABLE]},
        {**common, "name": "time_limit", "run": str(runs["time_limit"].root), "n": 2, "handler": "answer",
         "parquet": write_parquet(base / "mixed.parquet", mixed_rows), "time_limit_s": TIME_LIMIT_S,
         "warm_up_s": 0},   # its data file's `sleep` rows last 10 minutes: no warm-up with them
    ]
    workers = [start_verl_worker(verl, runs["scripted"]),
               start_main_worker(runs["time_limit"]), start_main_worker(runs["verl_servers"])]
    try:
        arguments = base / "scenarios.json"
        arguments.write_text(json.dumps({"scenarios": scenarios}))
        done = verl.run("-m", "tests.verl.manager_calls", str(arguments), timeout=900)
        assert done.returncode == 0, f"manager_calls failed:\n{done.stderr[-5000:]}"
        results = json.loads(done.stdout.strip().splitlines()[-1])
        results["left_running"] = {name: nothing_running(paths) for name, paths in runs.items()}
        results["queued_by_mismatch"] = fsops.list_names(runs["mismatch"].init_queue)
        results["verl_server_url"] = servers["sampling"].url
    finally:
        for worker in workers:
            stop_worker(worker)
    return results


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in result, f"{result['error']}: {result['message']}\n{result['traceback']}"
    return result


def test_logprobs_of_the_wrong_kind_are_refused_before_anything_is_queued(outcome: dict[str, Any]) -> None:
    r = outcome["mismatch"]
    assert r.get("error") == "LogprobModeMismatch", r
    assert "expects processed logprobs" in r["message"] and "(raw)" in r["message"]
    assert "--logprob-mode processed" in r["message"]
    assert outcome["queued_by_mismatch"] == []


def test_verls_default_compute_score_runs_at_eval_on_our_workers(outcome: dict[str, Any]) -> None:
    r = ok(outcome["verl_score"])
    by_truth = dict(zip(r["ground_truths"], r["rewards"]))
    assert by_truth["7"] == 1.0           # "#### 7"
    assert by_truth["11"] == 0.0          # "The answer is 11.": verl's strict gsm8k rule says 0
    assert r["reward_extra_keys"] == ["acc"]


def test_a_multi_turn_tool_task_masks_observations_and_is_scored_by_verl(outcome: dict[str, Any]) -> None:
    r = ok(outcome["tool"])
    assert r["samples"] == 4 and r["counts"]["ok"] == 4
    assert r["observation_tokens"] > 0 and r["mask_outside_attention"] == 0     # tool output: mask 0, attended
    assert all(t >= 4 for t in r["num_turns"])                                  # prompt, call, output, answer
    assert dict(zip(r["ground_truths"], r["rewards"])) == {"391": 1.0, "1024": -1.0}   # math_dapo: -1 wrong
    assert r["multi_modal_inputs"] == [{}] * 4 and r["uids_in_order"]           # verl's layout for text samples
    assert set(r["reward_extra_keys"]) == {"acc", "pred", "score"}
    assert r["advantages_finite"] and r["policy_loss_finite"]


def test_the_time_limit_returns_what_finished_cancels_the_rest_and_leaves_nothing_running(
        outcome: dict[str, Any]) -> None:
    r = ok(outcome["time_limit"])
    counts = r["counts"]
    assert r["samples"] == PROMPTS * 2 and counts["ok"] == PROMPTS and counts["cancelled"] == PROMPTS
    assert counts["masked"] == PROMPTS and counts["ok"] + counts["masked"] == r["samples"]
    assert [s for s in r["statuses"]] == ["ok", "ok", "cancelled", "cancelled"] * (PROMPTS // 2)
    tokens = dict.fromkeys(("ok", "cancelled"), 0)
    for count, status in zip(r["masked_tokens_per_sample"], r["statuses"]):
        tokens[status] += count
    assert tokens["cancelled"] == 0 and tokens["ok"] > 0                        # masked: no loss token
    assert TIME_LIMIT_S <= counts["seconds"] < TIME_LIMIT_S + 35                 # + the cancelled rows' grace
    assert outcome["left_running"]["time_limit"] == []                          # nothing queued or claimed
    assert r["advantages_finite"] and r["policy_loss_finite"] and r["mask_outside_attention"] == 0


def test_verls_own_servers_are_registered_and_carry_the_policy_version_of_each_step(outcome: dict[str, Any]) -> None:
    """verl's LLMServerClient over its real load balancer (a Ray actor) names the servers; the spool had none."""
    r = ok(outcome["verl_servers"])
    registry = r["registry"]
    assert [b["url"] for b in registry["backends"]] == [outcome["verl_server_url"]]
    entry = registry["backends"][0]
    assert entry["logprob_mode"] == "processed" and entry["protocol"] == "vllm"
    assert entry["tokenizer"] == str(tiny_model_dir())
    # a training batch at global step 3 is sampled by the weights of step 2; lag 1 keeps versions >= 1
    assert entry["policy_version"] == 2 and registry["policy_version"] == 2 and registry["min_policy_version"] == 1
    assert r["versions"] == [2] * 4 and r["counts"]["ok"] == 4


def test_the_gsm8k_rule_is_verls_and_number_differs_only_where_documented(outcome: dict[str, Any]) -> None:
    verl = ok(outcome["gsm8k_table"])
    assert verl["default"] == verl["gsm8k"]            # default_compute_score routes openai/gsm8k there
    for (reply, truth, differs), expected in zip(TABLE, verl["gsm8k"]):
        assert score(reply, truth, "gsm8k") == expected, reply
        assert (score(reply, truth, "number") != expected) is differs, reply


def test_verls_v1_trainer_contract_is_refused_with_the_setting_that_works(outcome: dict[str, Any]) -> None:
    """SpoolLoopManager with verl's v1 trainer: refused when created (the config says use_v1) and when
    handed a TensorDict, naming SpoolLoopManagerTQ (the v1 trainer's manager, tests/verl/test_fit.py)."""
    r = outcome["v1"]
    assert r["at_create"].startswith("VerlConfigError") and "SpoolLoopManagerTQ" in r["at_create"], r
    assert r["at_call"].startswith("VerlConfigError") and "SpoolLoopManagerTQ" in r["at_call"], r

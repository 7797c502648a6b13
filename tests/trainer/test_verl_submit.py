"""verl datasets submit as they are: data_source -> handler mapping, and the `answer` rules."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpc_rollout.handlers.answer import final_number, score
from hpc_rollout.handlers.chat import chat_messages
from orchestrator.spool import fsops
from orchestrator.spool.batches import queued_tickets
from orchestrator.config import ConfigError, RunConfig
from orchestrator.spool.jobs import JobSpec
from orchestrator.submission.submit import parse_source_handlers, submit_file
from tests.core.util import cli, make_run

GSM8K = [
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "Natalia sold 48 clips... How many?"}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, "answer": "... #### 72"}},
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "Weng earns $12 an hour..."}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "10"},
     "extra_info": {"split": "train", "index": 1, "answer": "... #### 10"}},
]


def verl_parquet(path: Path) -> Path:
    pq.write_table(pa.Table.from_pylist(GSM8K), path)
    return path


def queued_handlers(run: Path) -> list[str]:
    paths = make_run(run)
    return sorted(t.job.handler for t in queued_tickets(paths.init_queue))


def test_a_gsm8k_parquet_is_refused_with_the_fix_then_mapped_by_option_or_run_toml(tmp_path: Path) -> None:
    data = verl_parquet(tmp_path / "gsm8k.parquet")
    paths = make_run(tmp_path / "run")
    refused = cli("submit", str(paths.root), str(data), check=False)
    assert refused.returncode == 1 and "--source-handler openai/gsm8k=HANDLER" in refused.stderr
    assert fsops.list_names(paths.init_queue) == []

    cli("submit", str(paths.root), str(data), "--source-handler", "openai/gsm8k=answer", "--samples", "2")
    assert queued_handlers(paths.root) == ["answer"] * 4

    configured = make_run(tmp_path / "configured", **{"data_sources.openai/gsm8k": "answer"})
    assert "openai/gsm8k" in configured.run_config.read_text()
    report = submit_file(configured, data)
    assert report.jobs == 2 and not report.rejected
    ticket = queued_tickets(configured.init_queue)[0]
    assert (ticket.job.handler, ticket.job.data_source, ticket.job.instance_id) == ("answer", "openai/gsm8k", "0")
    assert ticket.job.instance["reward_model"]["ground_truth"] == "72"     # the row as it is


def test_handler_option_is_the_fallback_for_unmapped_data_sources(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    report = submit_file(paths, verl_parquet(tmp_path / "d.parquet"), handler="answer")
    assert report.jobs == 2 and not report.rejected
    job: JobSpec = queued_tickets(paths.init_queue)[0].job
    assert job.handler == "answer" and job.data_source == "openai/gsm8k"


def test_bad_mappings_are_refused() -> None:
    assert parse_source_handlers(("openai/gsm8k=answer", "a=b=chat")) == {"openai/gsm8k": "answer", "a=b": "chat"}
    with pytest.raises(ValueError, match="DATA_SOURCE=HANDLER"):
        parse_source_handlers(("openai/gsm8k",))
    with pytest.raises(ConfigError, match="must name a handler"):
        RunConfig.from_dict({"data_sources": {"openai/gsm8k": 3}})


def test_answer_rules() -> None:
    assert final_number("so 9 + 63 = 72 #### 72") == 72.0 and final_number("it is 1,234.5 apples") == 1234.5
    assert score("The answer is 72.", "72", "number") == 1.0
    assert score("#### 71 (not 72)", "72", "number") == 0.0
    assert score("7 apples", "7", "prefix") == 1.0 and score(" 7", "7", "prefix") == 0.0
    assert score("  yes ", "yes", "exact") == 1.0 and score("no answer", "72", "number") == 0.0


README_VERL_ROW = {"data_source": "answer", "prompt": [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": "Say hi."}],
                   "reward_model": {"style": "rule", "ground_truth": "hi"}, "extra_info": {"index": 4}}


def test_the_readme_verl_example_runs_on_its_handler_and_chat_takes_a_prompt_as_the_conversation(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    rows = tmp_path / "rows.jsonl"
    chat_row = {key: value for key, value in README_VERL_ROW.items() if key != "reward_model"} | {"data_source": "chat"}
    rows.write_text(json.dumps(README_VERL_ROW) + "\n" + json.dumps(chat_row) + "\n")
    report = submit_file(paths, rows, samples=2)
    assert report.rejected == [] and report.jobs == 4
    jobs = {t.job.handler: t.job for t in queued_tickets(paths.init_queue)}
    assert (jobs["answer"].data_source, jobs["answer"].instance_id) == ("answer", "4")
    assert (jobs["chat"].data_source, jobs["chat"].instance_id) == ("chat", "4")
    assert chat_messages(jobs["chat"].instance) == README_VERL_ROW["prompt"]
    assert chat_messages({"messages": [{"role": "user", "content": "a"}], "prompt": "ignored"}) == [
        {"role": "user", "content": "a"}]                      # the chat handler's own shape wins
    assert chat_messages({"prompt": "Say hi."}) == [{"role": "user", "content": "Say hi."}]
    for bad, why in (({}, "needs 'messages'"), ({"prompt": [{"role": "robot", "content": "x"}]}, r"prompt\[0\]")):
        with pytest.raises(ValueError, match=why):
            chat_messages(bad)

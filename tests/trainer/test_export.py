"""`hpc-rollout export`: SFT and DPO sets in the exact columns TRL's and verl's trainers read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from orchestrator.cli import cli
from orchestrator.config import Shards
from orchestrator.spool.shardlog import shard_name
from orchestrator.spool.shards import ShardWriter
from orchestrator.trainer.api import Spool

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def group(name: str, rewards: list[float | None], task: dict[str, Any], status: str = "ok") -> list[dict[str, Any]]:
    return [{"job_id": f"{name}-{i}", "group_id": name, "group_size": len(rewards), "sample_index": i,
             "instance_id": name, "handler": "chat", "status": status, "reward": reward,
             "instance": json.dumps(task), "result": json.dumps({"response_text": f"{name} answer {i}"}),
             "prompt_ids": [5, 6], "response_ids": [7, 8, 9], "response_mask": [1, 0, 1]}
            for i, reward in enumerate(rewards)]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    spool = Spool.create(tmp_path / "run")
    writer = ShardWriter(spool.paths, "w1", Shards())
    rows = (group("g-chat", [0.0, 1.0, 0.5], {"messages": CHAT})
            + group("g-equal", [1.0, 1.0], {"messages": CHAT})          # no reward spread: no DPO pair
            + group("g-text", [0.2, 0.0], {"prompt": "Say hi."})
            + group("g-failed", [None, None], {"prompt": "x"}, status="failed"))
    for row in rows:
        writer.add(row, row["job_id"])
    writer.commit()
    return spool.paths.root


def export(*args: str) -> Result:
    result = CliRunner().invoke(cli, ["export", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def load(path: Path) -> Any:
    import datasets

    kind = "parquet" if path.suffix == ".parquet" else "json"
    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(path.parent / "hf"))


def test_dpo_pairs_best_and_worst_and_skips_groups_without_spread(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "pairs.parquet"
    result = export(str(run), "--dpo", str(out))
    pairs = load(out)
    assert pairs.column_names == ["prompt", "chosen", "rejected"]
    by_chosen = {row["chosen"][0]["content"]: row for row in pairs}
    assert set(by_chosen) == {"g-chat answer 1", "g-text answer 0"}
    chat = by_chosen["g-chat answer 1"]
    assert chat["prompt"] == CHAT and chat["rejected"] == [{"role": "assistant", "content": "g-chat answer 0"}]
    # one type per dataset: the string prompt became a user turn
    assert by_chosen["g-text answer 0"]["prompt"] == [{"role": "user", "content": "Say hi."}]
    assert "4 group(s) selected, 2 pair(s) written" in result.output
    assert "skipped 1: no reward spread" in result.output and "skipped 1: no ok sample with a reward" in result.output


def test_sft_best_completion_as_trl_prompt_completion_in_jsonl(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    export(str(run), "--sft", str(out), "--handler", "chat", "--reward-min", "0.5")
    records = load(out)
    assert records.column_names == ["prompt", "completion"]
    assert sorted(r["completion"][0]["content"] for r in records) == ["g-chat answer 1", "g-equal answer 0"]


def test_sft_threshold_every_and_standard_prompts(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.parquet"
    result = export(str(run), "--sft", str(out), "--prompt", "g-text", "--every", "--threshold", "0.1")
    assert pq.read_table(out).to_pylist() == [{"prompt": "Say hi.", "completion": "g-text answer 0"}]
    assert "skipped 1: reward below 0.1" in result.output


def test_sft_verl_and_tokens_layouts(run: Path, tmp_path: Path) -> None:
    verl, tokens = tmp_path / "verl.parquet", tmp_path / "tokens.parquet"
    export(str(run), "--sft", str(verl), "--layout", "verl", "--prompt", "g-chat")
    export(str(run), "--sft", str(tokens), "--layout", "tokens", "--prompt", "g-chat")
    assert pq.read_table(verl).to_pylist() == [{
        "prompt": "2+2?", "response": "g-chat answer 1",
        "messages": [*CHAT, {"role": "assistant", "content": "g-chat answer 1"}]}]
    assert pq.read_table(tokens).to_pylist() == [{"input_ids": [5, 6, 7, 8, 9], "completion_mask": [0, 0, 1, 0, 1]}]


def test_response_text_decoded_with_a_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from orchestrator.devserver.tiny_model import tiny_model_dir

    directory = tiny_model_dir()
    ids = AutoTokenizer.from_pretrained(directory).encode("hello world", add_special_tokens=False)
    spool = Spool.create(tmp_path / "run")
    writer = ShardWriter(spool.paths, "w1", Shards())
    for row in group("g", [1.0, 0.0], {"prompt": "Greet."}):
        writer.add({**row, "result": None, "response_ids": ids, "response_mask": [1] * len(ids)}, row["job_id"])
    writer.commit()
    out = tmp_path / "pairs.jsonl"
    result = export(str(spool.paths.root), "--dpo", str(out))
    assert "skipped 1: no response text (pass --tokenizer" in result.output and out.read_bytes() == b""
    export(str(spool.paths.root), "--dpo", str(out), "--tokenizer", str(directory))
    assert load(out)[0] == {"prompt": "Greet.", "chosen": "hello world", "rejected": "hello world"}


def test_a_damaged_shard_is_named_and_the_rest_exported(run: Path, tmp_path: Path) -> None:
    writer = ShardWriter(Spool.open(run).paths, "w2", Shards())
    for row in group("g-lost", [0.0, 1.0], {"prompt": "y"}):
        writer.add(row, row["job_id"])
    writer.commit()
    damaged = run / "shards" / shard_name("w2", 1)
    damaged.write_bytes(b"PAR1 torn")
    out = tmp_path / "pairs.jsonl"
    result = export(str(run), "--dpo", str(out))
    assert f"warning: shards/{damaged.name}: " in result.output and load(out).num_rows == 2


def test_usage_errors_name_the_valid_choices(run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    assert "choose what to export: --sft or --dpo" in runner.invoke(cli, ["export", str(run), "x.jsonl"]).output
    bad = runner.invoke(cli, ["export", str(run), "--dpo", "x.jsonl", "--layout", "verl"])
    assert bad.exit_code != 0 and "DPO is written in the trl layout" in bad.output
    suffix = runner.invoke(cli, ["export", str(run), "--sft", str(tmp_path / "x.csv")])
    assert suffix.exit_code != 0 and "*.parquet or *.jsonl" in suffix.output

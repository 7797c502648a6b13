"""Chat jobs against the real tiny model behind `serve-llm --record`: ids are never re-tokenized."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from hpc_rollout.handlers.chat import ChatHandler
from orchestrator.devserver.local_server import local_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer
from tests.llm.helpers import chat_instance, heartbeat, make_ctx, run_dir


async def run_jobs(paths, n_jobs: int, sampling: dict) -> list[dict]:
    handler = ChatHandler()
    heartbeat(paths, "w1")

    async def one(index: int) -> dict:
        instance = chat_instance(2)
        instance["messages"][-1]["content"] += f" (question {index})"  # distinct prompts
        ctx = make_ctx(paths, "w1", f"sub-000001-{index:03d}", instance, sampling)
        prepared = await handler.init(ctx)
        result = await handler.run(ctx, prepared)
        result.update(await handler.eval(ctx, result))
        return result

    return await asyncio.gather(*(one(i) for i in range(n_jobs)))


def test_multi_turn_chat_keeps_exact_ids(tmp_path: Path) -> None:
    paths = run_dir(tmp_path)
    record = tmp_path / "record.jsonl"
    with local_server(record=record) as url:
        BackendRegistry.of(paths).add(url, version=7)
        results = asyncio.run(run_jobs(paths, 4, {"max_tokens": 12, "temperature": 1.0}))
    recorded = [orjson.loads(line) for line in record.read_bytes().splitlines()]
    by_prompt = {tuple(r["prompt_ids"]): r for r in recorded}
    assert len(recorded) == 4 * 3

    for result in results:
        turns = result["turns"]
        assert len(turns) == 3
        for index, turn in enumerate(turns):
            truth = by_prompt[tuple(turn["input_ids"])]
            assert turn["output_ids"] == truth["output_ids"]
            assert turn["logprobs"] == truth["logprobs"]
            assert turn["policy_version"] == 7 and turn["backend"] == url
            if index:
                previous = turns[index - 1]
                prefix = previous["input_ids"] + previous["output_ids"]
                assert turn["input_ids"][: len(prefix)] == prefix
        # The row's flat record is the last turn's input + output, masks and logprobs aligned.
        last = turns[-1]
        assert result["prompt_ids"] + result["response_ids"] == last["input_ids"] + last["output_ids"]
        assert len(result["response_mask"]) == len(result["response_ids"]) == len(result["logprobs"])
        sampled = [i for i, m in zip(result["response_ids"], result["response_mask"]) if m == 1]
        assert sampled == [t for turn in turns for t in turn["output_ids"]]
        sampled_lp = [lp for lp, m in zip(result["logprobs"], result["response_mask"]) if m == 1]
        assert sampled_lp == [lp for turn in turns for lp in turn["logprobs"]]
        assert result["policy_version_min"] == result["policy_version_max"] == 7
        assert 0.0 <= result["reward"] <= 1.0


def test_reencoding_would_change_ids() -> None:
    """The same samples, decoded then re-encoded, come back different: the test above can fail."""
    tokenizer = load_tokenizer(tiny_model_dir())
    record_free = []
    import torch  # noqa: F401  (the server's engine, used in-process here)
    from orchestrator.devserver.generation import Engine
    from orchestrator.devserver.sampling import GenRequest

    engine = Engine(tiny_model_dir(), threads=1)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"q{i}"}], tokenize=True,
                                             add_generation_prompt=True, return_dict=False) for i in range(20)]
    results = engine.generate([GenRequest(tuple(p), 16, seed=i) for i, p in enumerate(prompts)])
    for result in results:
        ids = result.output_ids
        record_free.append(tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) != ids)
    assert sum(record_free) >= 10, "decode-then-encode kept the ids: the fidelity test proves nothing"


def test_shard_rows_carry_the_recorded_samples(tmp_path: Path) -> None:
    """The same check through real workers: what lands in the Parquet shard is what was sampled."""
    from array import array

    from tests.llm.e2e import launch, new_run, rows, submit, wait

    paths = new_run(tmp_path)
    record = tmp_path / "record.jsonl"
    tasks = []
    for index in range(6):
        instance = chat_instance(2)
        instance["messages"][-1]["content"] += f" (question {index})"
        instance["sampling"] = {"max_tokens": 10}
        tasks.append(instance)
    with local_server(record=record) as url:
        BackendRegistry.of(paths).add(url, version=2)
        submit(paths, tasks)
        wait(paths, launch(paths, 2, 4))
    truth = {tuple(r["prompt_ids"]): r for r in map(orjson.loads, record.read_bytes().splitlines())}
    found = rows(paths)
    assert len(found) == 6 and all(r["status"] == "ok" for r in found)
    for row in found:
        turns = row["turns"]
        assert len(turns) == 3
        for index, turn in enumerate(turns):
            sampled = truth[tuple(turn["input_ids"])]
            assert turn["output_ids"] == sampled["output_ids"]
            # The shard stores logprobs as float32: equal to the recorded value cast the same way.
            assert array("f", turn["logprobs"]) == array("f", sampled["logprobs"])
            if index:
                prefix = turns[index - 1]["input_ids"] + turns[index - 1]["output_ids"]
                assert turn["input_ids"][: len(prefix)] == prefix
        assert list(row["prompt_ids"]) + list(row["response_ids"]) == turns[-1]["input_ids"] + turns[-1]["output_ids"]
        assert row["policy_version_min"] == row["policy_version_max"] == 2

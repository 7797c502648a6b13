"""Which logprobs a backend returns is the backend's property, recorded at `backend add`, never guessed.

Two real serve-llm servers: one started with `--logprobs-mode processed` (it says so in /v1/models),
one plain (says nothing: vLLM's default, raw). `backend add` records what each returns; a real
session's turns carry it; and the values are checked against the tiny model itself, teacher-forced,
at temperature 0.5, where raw and processed differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.llm.errors import RegistryError
from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.llm.logprob_mode import LogprobMode, parse_logprob_mode
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import router_for
from orchestrator.llm.session import LLMSession
from orchestrator.devserver.tiny_model import tiny_model_dir
from tests.core.util import cli, make_run

pytestmark = pytest.mark.llm
TEMPERATURE = 0.5


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, LocalServer]]:
    processed = start_server(threads=1, extra_args=("--logprobs-mode", "processed"))
    try:
        plain = start_server(threads=1)
        try:
            yield {"processed": processed, "plain": plain}
        finally:
            plain.stop()
    finally:
        processed.stop()


def teacher_forced(prompt: list[int], output: list[int], temperature: float) -> tuple[list[float], list[float]]:
    """(raw, processed) logprobs the tiny model gives `output` after `prompt`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir()), local_files_only=True).eval()
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    picked = torch.tensor(output).unsqueeze(-1)
    raw = torch.log_softmax(logits, -1).gather(-1, picked).squeeze(-1)
    processed = torch.log_softmax(logits / temperature, -1).gather(-1, picked).squeeze(-1)
    return raw.tolist(), processed.tolist()


def one_turn(run: Path) -> tuple[list[int], list[int], list[float], str]:
    async def go() -> tuple[list[int], list[int], list[float], str]:
        paths = make_run(run)
        router = router_for(paths, "w1", "testnode")
        async with LLMSession(router, job_id="j") as llm:
            prompt = list((await llm.tokenizer()).encode("the quick brown fox", add_special_tokens=False))
            turn = await llm.generate(prompt, {"temperature": TEMPERATURE, "seed": 7, "max_tokens": 12,
                                               "ignore_eos": True})
        await router.close()   # its connections, before this loop ends
        return prompt, turn.output_ids, turn.logprobs, turn.logprob_mode

    return asyncio.run(go())


@pytest.mark.parametrize("which, expected, source", [
    ("processed", "processed", "announced by the server"),
    ("plain", "raw", "vllm's default (the server does not say)"),
])
def test_backend_add_records_what_the_server_returns_and_turns_carry_it(
        servers: dict[str, LocalServer], tmp_path: Path, which: str, expected: str, source: str) -> None:
    run = make_run(tmp_path / "run")
    added = cli("backend", "add", str(run.root), servers[which].url)
    assert f"{expected} logprobs: {source}" in added.stdout
    assert BackendRegistry.of(run.root).read().backends[0].logprob_mode is LogprobMode(expected)

    prompt, output, logprobs, mode = one_turn(run.root)
    assert mode == expected and len(output) == 12
    raw, processed = teacher_forced(prompt, output, TEMPERATURE)
    truth, other = (processed, raw) if expected == "processed" else (raw, processed)
    assert logprobs == pytest.approx(truth, abs=2e-4)
    assert max(abs(a - b) for a, b in zip(logprobs, other)) > 0.05   # the other kind is far off


def test_the_flag_wins_and_bad_modes_are_refused(servers: dict[str, LocalServer], tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    added = cli("backend", "add", str(run.root), servers["plain"].url, "--logprob-mode", "processed_logprobs")
    assert "processed logprobs: given" in added.stdout
    assert one_turn(run.root)[3] == "processed"          # the client labels by the registry, not by protocol
    refused = cli("backend", "add", str(run.root), servers["plain"].url, "--logprob-mode", "raw_logits", check=False)
    assert refused.returncode != 0 and "use raw or processed" in refused.stderr
    down = cli("backend", "add", str(run.root), "http://127.0.0.1:9/v1", "--protocol", "sglang")
    assert "processed logprobs: sglang's default (the server does not answer yet" in down.stdout
    with pytest.raises(RegistryError, match="raw or processed"):
        parse_logprob_mode("sampled")
    registry = BackendRegistry.of(run.root)
    registry.add("http://127.0.0.1:10/v1")                 # the API, told nothing: the protocol's default
    assert registry.read().find("http://127.0.0.1:10/v1").served_logprobs is LogprobMode.RAW

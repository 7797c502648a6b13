"""The vLLM client against a stock vLLM server: what the protocol code promised, checked live."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.llm.client import Completion, RetryPolicy
from orchestrator.llm.http import BackendHttp
from orchestrator.llm.protocol_clients import client_for
from orchestrator.llm.registry import Backend
from orchestrator.llm.tokenizer import load_tokenizer
from orchestrator.llm.vllm import VLLMClient
from tests.vllm.conftest import MAX_MODEL_LEN, VLLMServer
from tests.vllm.relay import RecordingRelay

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

ONE_TRY = RetryPolicy(attempts=1, timeout_s=120)


async def _generate(url: str, prompt: list[int], sampling: dict[str, Any]) -> Completion:
    async with BackendHttp() as http:
        return await client_for(Backend(url=url), http, ONE_TRY).generate(prompt, sampling)


def generate(url: str, prompt: list[int], sampling: dict[str, Any]) -> Completion:
    return asyncio.run(_generate(url, prompt, sampling))


def chat_prompt(model_dir: Path, question: str) -> list[int]:
    tokenizer = load_tokenizer(model_dir)
    return list(tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=True, add_generation_prompt=True, return_dict=False))


def teacher_forced(model_dir: Path, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """log p(output[i] | prefix) from transformers with the same weights, at `temperature`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1: -1]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(output).unsqueeze(1)).squeeze(1).tolist()


def test_token_ids_in_and_out_with_raw_logprobs(relay: RecordingRelay, vllm_server: VLLMServer) -> None:
    model_dir = vllm_server.model_dir
    prompt = chat_prompt(model_dir, "Name a prime number.")
    completion = generate(relay.url, prompt, {"max_tokens": 12, "temperature": 0.7, "seed": 5, "min_tokens": 12})
    [exchange] = relay.completions()
    sent, choice = exchange.request, exchange.choice
    assert sent["prompt"] == prompt and sent["return_token_ids"] is True and sent["logprobs"] == 0
    assert choice["prompt_token_ids"] == prompt          # vLLM took our ids as they are
    assert completion.output_ids == choice["token_ids"] and len(completion.output_ids) == 12
    assert completion.logprobs == choice["logprobs"]["token_logprobs"]
    assert completion.finish_reason == choice["finish_reason"] == "length"
    assert completion.logprob_mode == "raw"
    # "raw": the model's own distribution, before temperature, to float32 precision.
    raw = teacher_forced(model_dir, prompt, completion.output_ids, 1.0)
    tempered = teacher_forced(model_dir, prompt, completion.output_ids, 0.7)
    assert max(abs(a - b) for a, b in zip(completion.logprobs, raw)) < 1e-4
    assert max(abs(a - b) for a, b in zip(completion.logprobs, tempered)) > 1e-2


def test_finish_reasons_length_and_stop(relay: RecordingRelay, vllm_server: VLLMServer) -> None:
    model_dir = vllm_server.model_dir
    tokenizer = load_tokenizer(model_dir)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")  # the model's EOS (generation_config)
    prompt = chat_prompt(model_dir, "Say nothing.")
    cut = generate(relay.url, prompt, {"max_tokens": 3, "seed": 1, "logit_bias": {str(end): -100}})
    stopped = generate(relay.url, prompt, {"max_tokens": 8, "seed": 1, "logit_bias": {str(end): 100}})
    answers = [e.choice for e in relay.completions()]
    assert (cut.finish_reason, len(cut.output_ids)) == ("length", 3) and end not in cut.output_ids
    assert stopped.finish_reason == "stop" and stopped.output_ids == [end]   # EOS is kept in the ids
    assert [a["finish_reason"] for a in answers] == ["length", "stop"]
    # Raw logprobs: the +100 bias that forced EOS does not show; the model's own value does.
    assert stopped.logprobs == answers[1]["logprobs"]["token_logprobs"] and stopped.logprobs[0] < -1.0


def test_model_id_and_context_length_come_from_v1_models(vllm_server: VLLMServer) -> None:
    async def info() -> Any:
        async with BackendHttp() as http:
            return await client_for(Backend(url=vllm_server.url), http, ONE_TRY).model_info()

    model = asyncio.run(info())
    assert model.model_id == str(vllm_server.model_dir) and model.max_model_len == MAX_MODEL_LEN


def test_max_tokens_is_capped_by_the_context_left(relay: RecordingRelay) -> None:
    nearly_full = [(7 * i) % 4000 + 10 for i in range(MAX_MODEL_LEN - 4)]
    capped = generate(relay.url, nearly_full, {"max_tokens": 100, "seed": 2})
    full = generate(relay.url, nearly_full + [11, 12, 13, 14], {"max_tokens": 100})
    [exchange] = relay.completions()                      # the full context sent nothing
    assert exchange.request["max_tokens"] == 4 and len(capped.output_ids) <= 4
    assert (full.output_ids, full.finish_reason) == ([], "length")
    # vLLM 0.32 clamps an oversized max_tokens itself, but refuses a full context outright (400,
    # which would fail the job): the client ends the conversation instead of asking.
    refused = httpx.post(f"{relay.url}/completions", timeout=60,
                         json={**exchange.request, "prompt": nearly_full + [11, 12, 13, 14], "max_tokens": 1})
    assert refused.status_code == 400 and "max_tokens must be at least 1" in refused.text


def test_ids_from_token_strings_when_the_server_gives_no_token_ids(vllm_server: VLLMServer) -> None:
    """The fallback for vLLM < 0.10.2, on a real answer: `return_token_ids` left out."""
    model_dir = vllm_server.model_dir
    prompt = chat_prompt(model_dir, "Count to three.")
    client = VLLMClient(Backend(url=vllm_server.url), BackendHttp(), ONE_TRY)
    _, body = client.build_request(str(model_dir), prompt, 10, {"seed": 9, "min_tokens": 10})
    with_ids = httpx.post(f"{vllm_server.url}/completions", json=body, timeout=120).json()
    legacy = httpx.post(f"{vllm_server.url}/completions", json={**body, "return_token_ids": False},
                        timeout=120).json()
    assert legacy["choices"][0].get("token_ids") is None           # only "token_id:N" strings left
    assert all(t.startswith("token_id:") for t in legacy["choices"][0]["logprobs"]["tokens"])
    recovered, direct = client.parse_response(legacy), client.parse_response(with_ids)
    assert recovered.output_ids == direct.output_ids == with_ids["choices"][0]["token_ids"]
    assert recovered.logprobs == direct.logprobs and len(recovered.output_ids) == 10


def test_seeded_prompts_longer_than_one_steps_budget_do_not_crash_the_server(vllm_server: VLLMServer) -> None:
    # vLLM 0.32 on CPU died ("CPU Generator does not use offset") when a seeded request's prefill was
    # split across steps: three prompts of 2,240 tokens against the 2,048-token step budget took
    # the shared server down in a CI run, and every later test in tests/vllm with it.
    vocabulary = len(load_tokenizer(vllm_server.model_dir))
    draw = random.Random(7)   # distinct prompts: a shared prefix would be cached, not prefilled again
    prompts = [[draw.randrange(10, vocabulary) for _ in range(length)] for length in (940, 400, 900, 960, 700, 880)]

    async def together() -> list[Completion]:
        async with BackendHttp() as http:
            client = client_for(Backend(url=vllm_server.url), http, ONE_TRY)
            return list(await asyncio.gather(*(client.generate(prompt, {"max_tokens": 4, "seed": 7, "min_tokens": 4})
                                               for prompt in prompts)))

    completions = asyncio.run(together())
    assert [len(c.output_ids) for c in completions] == [4] * len(prompts)
    assert httpx.get(f"{vllm_server.url}/models", timeout=30).status_code == 200

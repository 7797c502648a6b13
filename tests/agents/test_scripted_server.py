"""serve-llm --scripted: predetermined replies rendered by the real tokenizer, served over the
real protocols (vLLM completions with token ids, SGLang /generate), through the real client."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from orchestrator.devserver.local_server import local_server
from orchestrator.devserver.scripted import ScriptError, load_scripts
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer

pytestmark = [pytest.mark.llm]


def test_scripted_replies_are_served_as_ids_and_logprobs(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps([{"match": "capital of France", "replies": ["Paris.", "Still Paris."], "after": "Done."},
                                   {"match": "", "replies": ["I do not know."]}]))
    tokenizer = load_tokenizer(tiny_model_dir())
    eos = tokenizer.eos_token_id

    def prompt(*turns: str) -> list[int]:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        for text in turns:
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Sure?"}]
        return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))

    with local_server(tiny=True, extra_args=["--scripted", str(scripts)]) as url:
        def complete(ids: list[int], max_tokens: int = 64) -> dict:
            body = {"prompt": ids, "max_tokens": max_tokens, "logprobs": 0, "return_token_ids": True}
            return httpx.post(f"{url}/completions", json=body, timeout=30).json()["choices"][0]

        first = complete(prompt())
        assert first["token_ids"] == tokenizer.encode("Paris.", add_special_tokens=False) + [eos]
        assert first["finish_reason"] == "stop" and first["logprobs"]["token_logprobs"] == [0.0] * len(first["token_ids"])
        assert complete(prompt("Paris."))["text"].startswith("Still Paris.")
        assert complete(prompt("Paris.", "Still Paris."))["text"].startswith("Done.")
        cut = complete(prompt(), max_tokens=1)
        assert cut["finish_reason"] == "length" and len(cut["token_ids"]) == 1
        other = list(tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=True,
                                                   add_generation_prompt=True, return_dict=False))
        assert complete(other)["text"].startswith("I do not know.")
        root = url.removesuffix("/v1")
        sglang = httpx.post(f"{root}/generate", json={"input_ids": prompt(), "return_logprob": True,
                                                       "sampling_params": {"max_new_tokens": 32}}, timeout=30).json()
        assert sglang["output_ids"] == first["token_ids"]
        assert [lp for lp, _, _ in sglang["meta_info"]["output_token_logprobs"]] == [0.0] * len(first["token_ids"])


def test_scripts_file_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"match": "x", "replies": "not a list"}]')
    with pytest.raises(ScriptError, match="script 0: expected"):
        load_scripts(bad)
    bad.write_text("{nope")
    with pytest.raises(ScriptError, match="neither JSON nor JSON Lines"):
        load_scripts(bad)

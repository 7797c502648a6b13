"""A worker loads the tokenizer AutoTokenizer would, without importing torch once the class is known.

AutoTokenizer reads the model's config to pick the class, which imports torch (~3 s of CPU in every
worker and proxy process); orchestrator/llm/tokenizer.py remembers the class it picked per directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.devserver.tiny_model import tiny_digits_model_dir, tiny_model_dir
from orchestrator.llm import tokenizer as tokenizer_module

CONVERSATION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 12 + 30?"},
                {"role": "assistant", "content": "42"}, {"role": "user", "content": "and 7 * 6?"}]

LOAD_TWICE = """
import json, sys
from orchestrator.llm.tokenizer import load_tokenizer
tokenizer = load_tokenizer(sys.argv[1])
print(json.dumps({"class": type(tokenizer).__name__, "torch": "torch" in sys.modules,
                  "ids": tokenizer.encode("What is 12 + 30? <|im_end|> 42"),
                  "prompt": tokenizer.apply_chat_template(json.loads(sys.argv[2]), tokenize=False,
                                                          add_generation_prompt=True),
                  "decoded": tokenizer.decode([80, 77, 84, 84, 87]), "eos": tokenizer.eos_token_id}))
"""


def load_in_new_python(directory: Path, cache: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", LOAD_TWICE, str(directory), json.dumps(CONVERSATION)],
                          env={**os.environ, "HPC_ROLLOUT_CACHE": str(cache)}, capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("model_dir", [tiny_model_dir, tiny_digits_model_dir], ids=["tiny", "digits"])
def test_the_second_process_loads_the_same_tokenizer_without_torch(model_dir, tmp_path: Path) -> None:
    directory = model_dir()
    first = load_in_new_python(directory, tmp_path / "cache")
    second = load_in_new_python(directory, tmp_path / "cache")
    assert first.pop("torch") is True, "the first load goes through AutoTokenizer (which imports torch)"
    assert second.pop("torch") is False, "the remembered class was not used"
    assert second == first
    assert len(list((tmp_path / "cache" / "tokenizer-classes").iterdir())) == 1


def test_a_changed_directory_is_judged_again(tmp_path: Path) -> None:
    directory = shutil.copytree(tiny_model_dir(), tmp_path / "model")
    cache = tmp_path / "cache"
    load_in_new_python(directory, cache)
    config = directory / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"TokenizersBackend"', '"PreTrainedTokenizerFast"'))
    assert load_in_new_python(directory, cache)["torch"] is True
    assert len(list((cache / "tokenizer-classes").iterdir())) == 2


def test_a_memo_that_is_not_a_class_name_or_not_a_file_is_ignored(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HPC_ROLLOUT_CACHE", str(tmp_path / "cache"))
    memo = tokenizer_module.memo_path(tiny_model_dir())
    memo.parent.mkdir(parents=True)
    for content in ("os", "__import__", "not a name", "PreTrainedModel\n" * 40, "PreTrainedModel", "AutoModel",
                    "Qwen2ForCausalLM", "AutoTokenizer"):   # not a tokenizer class: from_pretrained would load a model
        memo.write_text(content)
        assert tokenizer_module.remembered_class(memo) is None, content
    memo.unlink()
    os.mkfifo(memo)   # a planted FIFO must not block the worker's open
    assert tokenizer_module.remembered_class(memo) is None
    memo.unlink()
    memo.write_text("Qwen2Tokenizer")
    assert tokenizer_module.remembered_class(memo).__name__ == "Qwen2Tokenizer"


def test_a_memo_written_by_another_user_is_not_trusted(tmp_path: Path, monkeypatch) -> None:
    # $HPC_ROLLOUT_CACHE may be a group's directory: a member's memo could name another class
    monkeypatch.setenv("HPC_ROLLOUT_CACHE", str(tmp_path / "cache"))
    memo = tokenizer_module.memo_path(tiny_model_dir())
    memo.parent.mkdir(parents=True)
    memo.write_text("Qwen2Tokenizer")
    assert tokenizer_module.remembered_class(memo) is not None
    monkeypatch.setattr(tokenizer_module.os, "getuid", lambda: os.stat(memo).st_uid + 1)
    assert tokenizer_module.remembered_class(memo) is None


def test_remote_code_is_never_remembered(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HPC_ROLLOUT_CACHE", str(tmp_path / "cache"))
    directory = shutil.copytree(tiny_model_dir(), tmp_path / "model")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": {"AutoTokenizer": [None, "x.Y"]}}))
    from transformers import PreTrainedTokenizerFast
    memo = tokenizer_module.memo_path(directory)
    tokenizer_module.remember_class(memo, directory, PreTrainedTokenizerFast)
    assert not memo.exists()
    tokenizer_module.remember_class(memo, directory, type("Qwen2Tokenizer", (), {}))   # not transformers' own
    assert not memo.exists()


def test_a_cache_that_cannot_be_written_still_loads(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    result = load_in_new_python(tiny_model_dir(), tmp_path / "cache")
    assert result["class"] == "Qwen2Tokenizer" and result["torch"] is True

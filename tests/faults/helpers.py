"""Helpers of the fault tests: chat jobs against a fake vLLM, run directories with a backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.llm.registry import BackendRegistry
from orchestrator.paths import SpoolPaths


def tiny_tokenizer() -> Path:
    """The tiny model's directory (its tokenizer serves the chat handler); built offline once."""
    from orchestrator.llm.tiny_model import tiny_model_dir

    return tiny_model_dir()


def chat_task(index: int) -> dict[str, Any]:
    return {"handler": "chat", "instance": {
        "messages": [{"role": "user", "content": f"Count to {index}."}], "user_turns": ["Again?"],
    }}


def register(paths: SpoolPaths, url: str) -> None:
    BackendRegistry.of(paths).add(url, model="fake", tokenizer=str(tiny_tokenizer()))

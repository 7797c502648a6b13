"""Helpers of the fault tests: chat jobs against a fake vLLM, run directories with a backend."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.paths import SpoolPaths


def tiny_tokenizer() -> Path:
    """The tiny model's directory (its tokenizer serves the chat handler); built offline once."""
    from orchestrator.devserver.tiny_model import tiny_model_dir

    return tiny_model_dir()


def chat_task(index: int) -> dict[str, Any]:
    return {"handler": "chat", "instance": {
        "messages": [{"role": "user", "content": f"Count to {index}."}], "user_turns": ["Again?"],
    }}


def register(paths: SpoolPaths, url: str) -> None:
    BackendRegistry.of(paths).add(url, model="fake", tokenizer=str(tiny_tokenizer()))


@contextmanager
def small_tmpfs(directory: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB mounted on `directory` (root only): a disk that really fills up."""
    if os.getuid() != 0:
        pytest.skip("mounting a small tmpfs to fill a disk needs root (CI runs as root)")
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill_disk(directory: Path, keep_free: int = 0) -> Path:
    """Write a file until the filesystem holding `directory` is full (leaving `keep_free` bytes)."""
    filler = directory / "filler.bin"
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize - keep_free
    with open(filler, "wb", buffering=0) as handle:
        chunk = b"\0" * (1 << 16)
        try:
            while free > 0:
                free -= handle.write(chunk[: max(1, min(len(chunk), free))])
        except OSError:
            pass
    return filler

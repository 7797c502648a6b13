"""Loading a tokenizer for token-in/token-out work: from a local directory only, never the network."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """A tokenizer from a local directory, never from the network."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"tokenizer directory {path} does not exist: give a local path (the registry's "
            f"`tokenizer` field, or `model` when it is a directory)"
        )
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)

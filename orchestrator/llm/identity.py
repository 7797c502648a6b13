"""Which tokenizer produced a trajectory: a short hash of the tokenizer files of a local directory.

Two directories holding the same tokenizer files give the same hash, so a row can be matched to
the tokenizer a trainer uses without comparing paths that differ between machines.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

# Files that define how text becomes ids (Hugging Face layouts); weights and configs are left out.
TOKENIZER_FILE_PREFIXES = (
    "tokenizer", "vocab", "merges", "special_tokens_map", "added_tokens", "spiece", "chat_template",
)
HASH_CHARS = 16


def tokenizer_hash(path: str | None) -> str | None:
    """`sha256:<16 hex>` over the tokenizer files of directory `path`; None when it is not local."""
    if not path:
        return None
    directory = Path(path)
    if not directory.is_dir():
        return None
    files = sorted(
        p for p in directory.iterdir()
        if p.is_file() and p.name.startswith(TOKENIZER_FILE_PREFIXES)
    )
    if not files:
        return None
    signature = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _hash_files(str(directory.resolve()), signature)


@functools.lru_cache(maxsize=32)
def _hash_files(directory: str, signature: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _, _ in signature:
        digest.update(name.encode() + b"\0")
        digest.update((Path(directory) / name).read_bytes())
        digest.update(b"\0")
    return f"sha256:{digest.hexdigest()[:HASH_CHARS]}"

"""Which tokenizer produced a trajectory: a short hash of the tokenizer files of a local directory.

Two directories holding the same tokenizer files give the same hash, so a row can be matched to
the tokenizer a trainer uses without comparing paths that differ between machines.
"""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path

# Files that define how text becomes ids (Hugging Face layouts); weights and configs are left out.
TOKENIZER_FILE_PREFIXES = (
    "tokenizer", "vocab", "merges", "special_tokens_map", "added_tokens", "spiece", "chat_template",
)
HASH_CHARS = 16


# A directory's files are listed again at most this often per process: every turn of every job
# names its tokenizer, and listing and stating its files cost a busy worker 4% of its loop.
RECHECK_S = 5.0
RECENT_KEPT = 64
_recent: dict[str, tuple[float, str | None]] = {}   # path -> (when looked at, hash), monotonic


def tokenizer_hash(path: str | None) -> str | None:
    """`sha256:<16 hex>` over the tokenizer files of directory `path`; None when it is not local.
    As the files were at most RECHECK_S ago."""
    if not path:
        return None
    now = time.monotonic()
    seen = _recent.get(path)
    if seen is not None and now - seen[0] < RECHECK_S:
        return seen[1]
    identity = _hash_of_directory(path)
    if len(_recent) >= RECENT_KEPT:
        _recent.clear()
    _recent[path] = (now, identity)
    return identity


def _hash_of_directory(path: str) -> str | None:
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

"""Loading a tokenizer for token-in/token-out work: from a local directory only, never the network.

transformers' AutoTokenizer picks the tokenizer class from the model's config, and reading a config
imports torch: ~2.3 s of CPU in every worker and proxy process (measured), which need only ids and a chat
template. The class AutoTokenizer picked is remembered per tokenizer directory, keyed on
transformers' version and the directory's files (name, size, mtime), so later processes load that
class directly and never import torch. A directory whose files change, or a class that is not one
of transformers' own (remote code), goes through AutoTokenizer again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from orchestrator.spool import fsops

MEMO_LIMIT = 256   # a class name


def cache_home() -> Path:
    """This node's cache of hpc-rollout ($HPC_ROLLOUT_CACHE, else ~/.cache/hpc-rollout)."""
    configured = os.environ.get("HPC_ROLLOUT_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "hpc-rollout"


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """A tokenizer from a local directory, never from the network."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"tokenizer directory {path} does not exist: give a local path (the registry's "
            f"`tokenizer` field, or `model` when it is a directory)"
        )
    memo = memo_path(directory)
    remembered = remembered_class(memo)
    if remembered is not None:
        return remembered.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    remember_class(memo, directory, type(tokenizer))
    return tokenizer


def memo_path(directory: Path) -> Path:
    """Where the class chosen for this directory, as it is now, under this transformers, is kept."""
    import transformers

    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{transformers.__version__}\0{directory.resolve()}\0".encode())
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file():
            st = entry.stat()
            digest.update(f"{entry.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return cache_home() / "tokenizer-classes" / digest.hexdigest()


def remembered_class(memo: Path) -> type[Any] | None:
    """The tokenizer class remembered in `memo`, if this user wrote it and transformers still exports
    that class; None otherwise. The cache may be a group's directory: a memo of another user could
    name another class, and a model class's from_pretrained would load weights as the tokenizer."""
    import transformers

    try:
        content, st = fsops.read_regular(memo, MEMO_LIMIT)
        name = content.decode().strip()
    except (OSError, UnicodeDecodeError):   # none yet, or not a plain file (fsops refuses links, FIFOs)
        return None
    if st.st_uid != os.getuid():
        return None
    found = getattr(transformers, name, None) if name.isidentifier() else None
    tokenizer_base = transformers.PreTrainedTokenizerBase
    return found if isinstance(found, type) and issubclass(found, tokenizer_base) else None


def remember_class(memo: Path, directory: Path, chosen: type) -> None:
    """Keep `chosen` for the next process, when loading it by name gives the same tokenizer: one of
    transformers' own classes, and no remote code named by the directory's tokenizer_config.json."""
    import transformers

    if getattr(transformers, chosen.__name__, None) is not chosen:
        return
    try:
        if b'"auto_map"' in fsops.read_bytes(directory / "tokenizer_config.json"):
            return
    except FileNotFoundError:
        pass
    except OSError:
        return
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        fsops.write_atomic(memo, chosen.__name__.encode(), durability=fsops.Durability.NONE)
    except OSError:
        pass   # a read-only cache: every process takes AutoTokenizer's path, as before

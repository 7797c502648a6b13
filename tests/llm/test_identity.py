"""The tokenizer identity a row carries: a hash of the tokenizer files, looked at now and then."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm import identity


def tokenizer_copy(into: Path) -> Path:
    into.mkdir()
    for source in tiny_model_dir().iterdir():
        if source.is_file() and source.name.startswith(identity.TOKENIZER_FILE_PREFIXES):
            shutil.copy2(source, into / source.name)
    return into


def test_the_same_files_give_the_same_identity_wherever_they_lie(tmp_path: Path) -> None:
    first, second = tokenizer_copy(tmp_path / "a"), tokenizer_copy(tmp_path / "b")
    assert identity.tokenizer_hash(str(first)) == identity.tokenizer_hash(str(second)) is not None
    assert identity.tokenizer_hash(str(tmp_path / "absent")) is None and identity.tokenizer_hash(None) is None


def test_a_directory_is_looked_at_once_per_recheck_period_not_per_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every turn of every job names its tokenizer: its files are listed and stated at most once
    per RECHECK_S, and a change of them shows after that."""
    directory = tokenizer_copy(tmp_path / "tok")
    clock = [1000.0]
    monkeypatch.setattr(identity.time, "monotonic", lambda: clock[0])
    looks = []
    original = identity._hash_of_directory
    monkeypatch.setattr(identity, "_hash_of_directory", lambda path: (looks.append(path), original(path))[1])
    before = [identity.tokenizer_hash(str(directory)) for _ in range(50)]
    assert len(set(before)) == 1 and len(looks) == 1
    vocabulary = next(p for p in directory.iterdir() if p.name.startswith("tokenizer"))
    vocabulary.write_bytes(vocabulary.read_bytes() + b" ")
    clock[0] += identity.RECHECK_S / 2
    assert identity.tokenizer_hash(str(directory)) == before[0] and len(looks) == 1
    clock[0] += identity.RECHECK_S
    assert identity.tokenizer_hash(str(directory)) not in (None, before[0]) and len(looks) == 2


def test_a_tokenizer_symlink_is_resolved_once_per_recheck_period_and_followed_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every job asks for its tokenizer's directory: it is resolved at most once per RECHECK_S,
    and a `latest` link re-pointed to a new checkpoint is followed after that. A path that is not
    a directory yet is looked at again on the next ask."""
    from orchestrator.llm import session

    clock = [2000.0]
    monkeypatch.setattr(session.time, "monotonic", lambda: clock[0])
    old, new = tokenizer_copy(tmp_path / "step-1"), tokenizer_copy(tmp_path / "step-2")
    latest = tmp_path / "latest"
    latest.symlink_to(old)
    assert session.tokenizer_directory(str(latest)) == str(old.resolve())
    latest.unlink()
    latest.symlink_to(new)
    assert session.tokenizer_directory(str(latest)) == str(old.resolve())   # within the period
    clock[0] += identity.RECHECK_S
    assert session.tokenizer_directory(str(latest)) == str(new.resolve())
    later = tmp_path / "later"
    assert session.tokenizer_directory(str(later)) is None
    tokenizer_copy(later)
    assert session.tokenizer_directory(str(later)) == str(later.resolve())

"""A worker's progress journal: append-only records of what its claims have done since they
were written, kept inside its claim directory.

Saving a ticket is three metadata operations (create, flush, rename); appending a line to a
file that is already open is none: on Lustre and GPFS the write and its flush go to the data
servers, not to the metadata server. So progress that only this worker needs to carry on,
but that recovery must not lose (a RUN output before this worker's own EVAL), is appended
here instead of rewriting the claim file. docs/scale.md counts what it saves.

The journal is a dot-file of the claim directory (`active/<worker>/.journal-<n>`): hidden
from every listing of claims (fsops.list_names), and moved together with the claims it
describes when a reaper renames the directory away (fencing). A record is one line,
`<crc32 of the json, 8 hex digits> <json>\\n`: a line torn by a crash mid-append, or
damaged, fails its checksum and is ignored, never fatal. The file is rotated once it passes
`rotate_bytes`: a new `.journal-<n+1>` carries the entries of jobs still claimed, then the
old one is unlinked (two metadata operations per rotation). A crash between the two leaves
both files: readers read every `.journal-*` in order, later records winning.

Durability is that of a ticket save (fsops.Durability.DATA): an appended record survives a
crash of the worker; after a crash of the node the journal's creation may be undone, as a
save's rename may, and the job then runs again from its claim, never twice to a row.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.access import Owners, read_checked
from orchestrator.spool.jobs import Stage
from orchestrator.spool.tickets import Ticket

log = logging.getLogger(__name__)

PREFIX = ".journal-"
# Rotate past this size, or twice what the live entries took at the last rotation when that
# is more (a few very large RUN outputs must not make every append rotate).
ROTATE_BYTES = 1 << 20


class RecordKind(str, enum.Enum):
    """What a record says about its job. Readers skip kinds they do not know (a newer writer)."""

    RUN_OUTPUT = "run_output"   # RUN done in this worker, EVAL next here: body = Ticket.progress()


@dataclass(frozen=True)
class JournalEntry:
    kind: RecordKind
    job_id: str
    attempt: int
    body: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        payload = orjson.dumps({"kind": self.kind.value, "job": self.job_id, "attempt": self.attempt,
                                "body": self.body})
        return b"%08x %s\n" % (zlib.crc32(payload), payload)

    @classmethod
    def decode(cls, line: bytes) -> "JournalEntry | None":
        """The entry a whole line holds; None when it is damaged or of an unknown kind."""
        checksum, _, payload = line.partition(b" ")
        try:
            if int(checksum, 16) != zlib.crc32(payload):
                return None
            raw = orjson.loads(payload)
            return cls(RecordKind(raw["kind"]), str(raw["job"]), int(raw["attempt"]), dict(raw["body"]))
        except (ValueError, KeyError, TypeError):   # orjson.JSONDecodeError is a ValueError
            return None


def journal_files(names: Iterable[str]) -> list[str]:
    """The journal files among a directory's `names`, oldest first."""
    found = [n for n in names if n.startswith(PREFIX) and n[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda n: int(n[len(PREFIX):]))


def read(claim_dir: Path, names: Iterable[str] | None = None,
         quarantine: Path | None = None, owners: Owners | None = None) -> dict[str, JournalEntry]:
    """The latest entry per job of the journal in `claim_dir` (one open per journal file).

    `names`: the directory's entries when the caller has listed it already (saves a listing).
    A journal file that cannot be read is skipped (its jobs resume from their saved claims),
    and moved to `quarantine` when given, so that it stops no later reader; so is one that a user
    the run does not trust could have written (`owners`: the run's, spool/access.py).
    """
    latest: dict[str, JournalEntry] = {}
    for name in journal_files(fsops.list_all_names(claim_dir) if names is None else names):
        try:
            data, refusal = read_checked(owners, claim_dir / name)   # its records decide what resumes
            if refusal:
                raise fsops.UnsafeSpoolFile(refusal)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s: unreadable journal skipped (%s)", claim_dir / name, exc)
            if quarantine is not None:
                with contextlib.suppress(OSError):
                    fsops.quarantine(claim_dir / name, quarantine, f"unreadable journal: {exc}")
            continue
        lines = data.split(b"\n")
        damaged = 0
        for line in lines[:-1]:   # the last piece has no newline: empty, or a torn append
            entry = JournalEntry.decode(line)
            if entry is None:
                damaged += 1
            else:
                latest[entry.job_id] = entry
        if damaged:
            log.warning("%s: %d damaged (or unknown) journal record(s) ignored", claim_dir / name, damaged)
    return latest


def resume_journaled(ticket: Ticket, entry: JournalEntry | None) -> bool:
    """Apply the RUN output journaled for this very attempt to a claim saved before it; True
    when applied (the ticket now reads as if it had been saved with that output).

    The attempt must match (a record of an earlier attempt says nothing about this one), and
    only a ticket still before EVAL takes it (one saved later already holds as much).
    """
    if entry is None or entry.kind is not RecordKind.RUN_OUTPUT or entry.attempt != ticket.attempt:
        return False
    if ticket.status is not None or ticket.stage is Stage.EVAL:
        return False
    try:
        ticket.resume(entry.body)
    except (KeyError, TypeError, ValueError) as exc:   # a record we cannot use: RUN again
        log.warning("job %s: journaled RUN output unusable (%s); it runs again", ticket.name, exc)
        return False
    return True


class Journal:
    """The journal this worker appends to, in its own claim directory.

    The file is created at the first append (a worker that never journals costs nothing).
    Single writer: the worker's event loop; readers are recovery, after the directory is
    renamed away or the worker stopped.
    """

    def __init__(self, claim_dir: Path, rotate_bytes: int | None = None) -> None:
        self.claim_dir = claim_dir
        self.rotate_bytes = rotate_bytes or ROTATE_BYTES
        self.generation = 1 + max((int(n[len(PREFIX):]) for n in journal_files(fsops.list_all_names(claim_dir))), default=0)
        self.rotations = 0
        self.appended = 0   # bytes, over every file
        self._fd: int | None = None
        self._size = 0
        self._limit = self.rotate_bytes
        self._latest: dict[str, JournalEntry] = {}

    @classmethod
    def open(cls, claim_dir: Path, rotate_bytes: int | None = None) -> "Journal":
        return cls(claim_dir, rotate_bytes)

    @property
    def path(self) -> Path:
        return self._file(self.generation)

    def _file(self, generation: int) -> Path:
        return self.claim_dir / f"{PREFIX}{generation:06d}"

    @property
    def size(self) -> int:
        return self._size

    def entries(self) -> dict[str, JournalEntry]:
        """The latest entry per job appended since the last rotation dropped obsolete ones."""
        return dict(self._latest)

    def append(self, entry: JournalEntry) -> None:
        """Append `entry` and flush its data: once this returns, recovery will find it."""
        if self._fd is None:
            self._fd = self._create(self.path)
        data = entry.encode()
        fsops.append_flushed(self._fd, data)
        self._size += len(data)
        self.appended += len(data)
        self._latest[entry.job_id] = entry

    def due(self) -> bool:
        return self._size > self._limit

    def rotate(self, live_jobs: set[str]) -> None:
        """Carry the entries of `live_jobs` (still claimed) into a new file, drop the old one."""
        old_fd = self._fd
        if old_fd is None:
            return   # nothing written yet
        keep = {job: entry for job, entry in self._latest.items() if job in live_jobs}
        data = b"".join(entry.encode() for entry in keep.values())
        old_path = self.path
        new_path = self._file(self.generation + 1)
        fd = self._create(new_path)
        try:
            if data:
                fsops.append_flushed(fd, data)
        except BaseException:
            os.close(fd)
            fsops.unlink(new_path)   # an empty or cut-back file; the old one still holds all
            raise
        # Only once the new file holds the live entries may the old one go (a crash in
        # between leaves both: readers take the later records).
        self.generation += 1
        self._fd, self._size, self._latest = fd, len(data), keep
        self._limit = max(self.rotate_bytes, 2 * len(data))
        self.rotations += 1
        os.close(old_fd)
        fsops.unlink(old_path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _create(self, path: Path) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, fsops.modes().file)
        fsops.count("create")
        return fd


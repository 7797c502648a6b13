"""Which jobs of a claimed batch left the claim directory as tickets of their own.

A batch file stays in its worker's claim directory until every job in it is resolved. A job
resolves by its row (found in the worker's shards by recovery) or by leaving: it is written
as its own ticket in the claim directory, recorded here, then renamed into a queue. After a
crash at any point recovery can tell where each job is (orchestrator/spool/recovery.py):

- its own ticket still in the claim directory: that ticket is the job (returned like any claim);
- recorded here and gone: it is in a queue or beyond, the batch entry is skipped;
- neither: the batch entry is the job.

The file is a dot-file of the claim directory (`.handoffs`), so it goes with the directory when
recovery takes it over; each record is one line `handoff JOB CRC32` appended to an open file
and flushed (a data operation, no metadata one); a torn last line is ignored (its rename never
happened: the record is flushed first). The per-worker journal (orchestrator/spool/journal.py, kind
`handoff`) is meant to carry these records once it lands.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path

from orchestrator.spool import fsops

log = logging.getLogger(__name__)

HANDOFF_LOG = ".handoffs"
KIND = "handoff"


def _line(job_id: str) -> bytes:
    body = f"{KIND} {job_id}"
    return f"{body} {zlib.crc32(body.encode()):08x}\n".encode()


class HandoffLog:
    """Append-only, one per claim directory; opened at the first record."""

    def __init__(self, claims: Path) -> None:
        self.path = claims / HANDOFF_LOG
        self._fd: int | None = None

    def record(self, job_id: str) -> None:
        """Durably note that `job_id` is about to leave as its own ticket (call before the rename)."""
        if self._fd is None:
            self._fd = fsops.open_append(self.path)
            fsops.count("create")
        # A leading newline ends any line a failed append (a full disk) left half-written, so
        # this record is read whole whatever came before it.
        data = b"\n" + _line(job_id)
        if os.write(self._fd, data) != len(data):
            raise OSError(f"short write to {self.path}")
        os.fdatasync(self._fd)
        fsops.count("fsync")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """No batch is held any more (a clean stop): the log has nothing left to say."""
        self.close()
        if self.path.exists():
            fsops.unlink(self.path)


def read_handoffs(claims: Path) -> set[str]:
    """Job ids recorded in a claim directory's log (lines that fail their checksum are ignored)."""
    try:
        data = fsops.read_bytes(claims / HANDOFF_LOG, fsops.TICKET_READ_LIMIT)
    except FileNotFoundError:
        return set()
    except fsops.UnsafeSpoolFile as exc:   # not ours to follow or wait on: the batch entries stand
        log.warning("hand-off log ignored: %s", exc)
        return set()
    jobs = set()
    for raw in data.split(b"\n"):
        parts = raw.decode("utf-8", "replace").split(" ")
        if len(parts) == 3 and parts[0] == KIND and _line(parts[1]) == raw + b"\n":
            jobs.add(parts[1])
    return jobs

"""The measurements: each probe runs in both agents at once, in lockstep over their channel.

The `maker` changes the filesystem, the `watcher` looks at it; every delay is timed on the
watcher's own monotonic clock from the maker's "done" message (a message, not a file, so no
filesystem cache delays the start of the count). Races start on a "go" message to both.
Files are touched here directly with os calls, not through fsops: what is measured is the
filesystem itself, including what fsops works around.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.doctor.channel import Channel

MAKER, WATCHER = "maker", "watcher"
RACE_FILES = 64
SEEN_TIMEOUT_S = 90.0      # longer than NFS's acdirmax (60 s): a delay beyond it is reported as not seen
POLL_S = 0.01
VISIBILITY_PROBES = ("create", "create_after_opendir", "rename", "unlink", "change")


def run_all(role: str, channel: Channel, directory: Path) -> dict[str, Any]:
    """Every probe; the watcher's return value is the whole measurement."""
    results: dict[str, Any] = {"clock_offset_s": clock_offset(role, channel)}
    for name, probe in (("rename_race", rename_race), ("exclusive_create", exclusive_create),
                        ("directory_lock", directory_lock)):
        results[name] = probe(role, channel, directory / name)
    results["link_and_fsync"] = link_and_fsync(role, channel, directory / "link")
    for name in VISIBILITY_PROBES:
        results[f"visible_{name}_s"] = visibility(name, role, channel, directory / f"seen-{name}")
    results["torn_reads"] = torn_reads(role, channel, directory / "torn")
    return results


# -- the clocks -------------------------------------------------------------------------------
def clock_offset(role: str, channel: Channel, rounds: int = 7) -> float | None:
    """The watcher's wall clock minus the maker's, from the round trip with the least delay
    (NTP's rule: the offset is the remote time minus the mid-point of the round trip)."""
    if role == MAKER:
        for _ in range(rounds):
            sent = time.time()
            channel.step("ask")
            reply = channel.receive("time")
            channel.step("back", t0=sent, t1=reply["t"], t2=time.time())
        return None
    best: tuple[float, float] | None = None
    for _ in range(rounds):
        channel.receive("ask")
        channel.step("time", t=time.time())
        back = channel.receive("back")
        delay = back["t2"] - back["t0"]
        offset = back["t1"] - (back["t0"] + back["t2"]) / 2
        if best is None or delay < best[0]:
            best = (delay, offset)
    return round(best[1], 4) if best else None


# -- races ------------------------------------------------------------------------------------
def _race(role: str, channel: Channel, directory: Path, prepare: Callable[[], None],
          attempt: Callable[[int], bool]) -> dict[str, Any]:
    """Both agents try every one of RACE_FILES operations at once; each must have exactly one winner."""
    if role == MAKER:
        directory.mkdir(parents=True)
        prepare()
        channel.step("prepared")
    else:
        channel.receive("prepared")
        _wait_until_listed(directory, RACE_FILES)
    channel.step("go") if role == WATCHER else channel.receive("go")
    order = range(RACE_FILES) if role == MAKER else reversed(range(RACE_FILES))
    mine = sorted(n for n in order if attempt(n))
    if role == MAKER:
        channel.step("wins", wins=mine)
        return {}
    theirs = set(channel.receive("wins")["wins"])
    both = sorted(theirs & set(mine))
    nobody = sorted(set(range(RACE_FILES)) - theirs - set(mine))
    return {"ok": not both and not nobody, "tries": RACE_FILES, "won_by_both": len(both), "won_by_none": len(nobody)}


def _wait_until_listed(directory: Path, count: int) -> None:
    deadline = time.monotonic() + SEEN_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if len(os.listdir(directory)) >= count:
                return
        except FileNotFoundError:
            pass
        time.sleep(0.05)


def rename_race(role: str, channel: Channel, directory: Path) -> dict[str, Any]:
    """A claim: rename(queue/JOB, mine/JOB) by both agents; one of them must win each."""
    def prepare() -> None:
        for n in range(RACE_FILES):
            (directory / f"job{n}").write_bytes(b"x")

    own = directory.parent / f"{directory.name}-{role}"

    def attempt(n: int) -> bool:
        own.mkdir(exist_ok=True)   # the maker made the parent before "prepared"
        try:
            os.rename(directory / f"job{n}", own / f"job{n}")
            return True
        except FileNotFoundError:
            return False
    return _race(role, channel, directory, prepare, attempt)


def exclusive_create(role: str, channel: Channel, directory: Path) -> dict[str, Any]:
    """A lease or lock token: open(O_CREAT | O_EXCL) by both agents; one of them must create each."""
    def prepare() -> None:
        for n in range(RACE_FILES):
            (directory / f"marker{n}").write_bytes(b"")   # so that the watcher sees the directory filled in

    def attempt(n: int) -> bool:
        try:
            os.close(os.open(directory / f"token{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return True
        except FileExistsError:
            return False
    return _race(role, channel, directory, prepare, attempt)


def directory_lock(role: str, channel: Channel, directory: Path) -> dict[str, Any]:
    """The lock of spool/lease.py: rename a private non-empty directory onto NAME; it must fail
    (ENOTEMPTY or EEXIST) for the one that comes second."""
    def prepare() -> None:
        for n in range(RACE_FILES):
            (directory / f"marker{n}").write_bytes(b"")

    def attempt(n: int) -> bool:
        private = directory / f".{role}-{n}"
        private.mkdir()
        (private / role).write_bytes(b"")
        try:
            os.rename(private, directory / f"lock{n}")
            return True
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            return False
    return _race(role, channel, directory, prepare, attempt)


def link_and_fsync(role: str, channel: Channel, directory: Path) -> dict[str, Any]:
    """link(), fsync of a file and of a directory, syncfs: the maker tries, the watcher reports."""
    if role == WATCHER:
        return dict(channel.receive("flushes")["result"])
    directory.mkdir(parents=True)
    result: dict[str, Any] = {}
    for name, action in (("link", lambda: os.link(directory / "a", directory / "b")),
                         ("fsync_file", lambda: _fsync(directory / "a", os.O_RDONLY)),
                         ("fsync_dir", lambda: _fsync(directory, os.O_RDONLY | os.O_DIRECTORY))):
        (directory / "a").write_bytes(b"x") if not (directory / "a").exists() else None
        try:
            action()
            result[name] = "ok"
        except OSError as exc:
            result[name] = f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror}"
    channel.step("flushes", result=result)
    return result


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- how late the watcher sees what the maker did -------------------------------------------
def visibility(kind: str, role: str, channel: Channel, directory: Path) -> float | None:
    """Seconds from the maker's "done" until the watcher sees the change (None: not within
    SEEN_TIMEOUT_S). The watcher looks first, so that whatever its client caches is cached:
      create                a name it looked up while missing; it looks it up again
      create_after_opendir  the same, opening the directory before each look (fsops.refresh_dir)
      rename, unlink        a name it saw; renamed away / removed
      change                a file it stat-ed, replaced by a new one (a heartbeat's write)"""
    target = directory / "x"
    if role == MAKER:
        directory.mkdir(parents=True)
        if kind in ("rename", "unlink", "change"):
            target.write_bytes(b"before")
        channel.step("made")
        channel.receive("looked")
        if kind.startswith("create"):
            target.write_bytes(b"made")
        elif kind == "rename":
            os.rename(target, directory / "y")
        elif kind == "unlink":
            os.unlink(target)
        else:
            (directory / "x.new").write_bytes(b"after, longer")
            os.rename(directory / "x.new", target)
        channel.step("done")
        channel.receive("seen")
        return None
    channel.receive("made")
    before = _identity_when_seen(target, expect=kind not in ("create", "create_after_opendir"))
    channel.step("looked")
    channel.receive("done")
    started = time.monotonic()
    seen = None
    while time.monotonic() - started < SEEN_TIMEOUT_S:
        if kind == "create_after_opendir":
            os.close(os.open(directory, os.O_RDONLY | os.O_DIRECTORY))
        now = _identity(target)
        if (kind.startswith("create") and now is not None) or (kind in ("rename", "unlink") and now is None) \
                or (kind == "change" and now is not None and now != before):
            seen = round(time.monotonic() - started, 3)
            break
        time.sleep(POLL_S)
    channel.step("seen")
    return seen


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _identity_when_seen(path: Path, expect: bool) -> tuple[int, int, int] | None:
    """The watcher's first look: for a name the maker made, wait until it shows (it may be late)."""
    deadline = time.monotonic() + SEEN_TIMEOUT_S
    while True:
        if expect:
            os.close(os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY))
        found = _identity(path)
        if found is not None or not expect or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def torn_reads(role: str, channel: Channel, directory: Path) -> dict[str, Any]:
    """A file the watcher read, renamed over by the maker with longer content: the watcher reads
    it again and again (open, read, close) until it reads the new content; a read that is
    neither the old nor the new content is torn (what spool reads must survive by re-reading)."""
    old, new = json.dumps({"v": 1}).encode(), json.dumps({"v": 2, "pad": "x" * 200}).encode()
    target = directory / "ticket.json"
    if role == MAKER:
        directory.mkdir(parents=True)
        target.write_bytes(old)
        channel.step("made")
        channel.receive("looked")
        (directory / "ticket.json.new").write_bytes(new)
        os.rename(directory / "ticket.json.new", target)
        channel.step("done")
        channel.receive("seen")
        return {}
    channel.receive("made")
    _identity_when_seen(target, expect=True)
    target.read_bytes()
    channel.step("looked")
    channel.receive("done")
    started, torn, stale, seen = time.monotonic(), 0, 0, None
    while time.monotonic() - started < SEEN_TIMEOUT_S:
        data = target.read_bytes()
        if data == new:
            seen = round(time.monotonic() - started, 3)
            break
        torn, stale = torn + (data != old), stale + (data == old)
        time.sleep(POLL_S)
    channel.step("seen")
    return {"new_content_after_s": seen, "torn": torn, "old_content": stale}


def host_name() -> str:
    return socket.gethostname()

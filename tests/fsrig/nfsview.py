"""A view of a directory with a Linux NFS client's caching, as a FUSE filesystem (mfusepy).

bindfs and FUSE's own cache options give one attribute timeout for everything and a negative
cache that nothing but its timeout ends; an NFS client's rules are finer, and they are what the
spool meets on a cluster. This view keeps the caches itself (the kernel's are off: every lookup
and read reaches it) and follows those rules:

  attributes   a file's are kept `acregmin` seconds, a directory's `acdirmin` (NFS scales them
               up to acregmax / acdirmax for files that stay unchanged; the minimum is kept here)
  lookups      "no such file" is kept while the directory's cached attributes are fresh, and
               dropped once they are found changed (lookupcache=all); `positive`: never kept
  listings     a directory's names are kept while its cached attributes are fresh and unchanged
  open()       close-to-open (`cto`, the default): a file's attributes are fetched anew at open,
               and a directory's at opendir, which also drops its stale lookups and listing;
               `nocto`: open trusts the cache, so a file renamed over by another node reads cut
               to the size this node last saw, as the page cache of such a client does
  this node    what it does itself (create, rename, unlink, write) it sees at once, as an NFS
               client updates its caches from the server's replies

Everything else passes through to the real directory. One such view per emulated node.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any

import mfusepy

STAT_FIELDS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime",
               "st_ctime", "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_blocks")


@dataclass(frozen=True)
class ClientTimes:
    acregmin: float = 3.0
    acdirmin: float = 30.0
    lookupcache: str = "all"      # all | positive | none
    cto: bool = True

    @classmethod
    def parse(cls, text: str) -> "ClientTimes":
        """`acregmin=3,acdirmin=30,lookupcache=all,cto` (nocto for no close-to-open)."""
        fields: dict[str, Any] = {}
        for item in filter(None, text.split(",")):
            key, _, value = item.partition("=")
            if key in ("cto", "nocto"):
                fields["cto"] = key == "cto"
            elif key == "lookupcache":
                fields[key] = value
            else:
                fields[key] = float(value)
        return cls(**fields)

    def options(self) -> str:
        return f"acregmin={self.acregmin:g},acdirmin={self.acdirmin:g},lookupcache={self.lookupcache}," + (
            "cto" if self.cto else "nocto")


@dataclass
class Cached:
    attrs: dict[str, Any]
    at: float


def _type_bits(entry: os.DirEntry[str]) -> int:
    if entry.is_symlink():
        return stat.S_IFLNK
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG
    return stat.S_IFIFO   # FIFOs, sockets, devices: their exact kind is in their attributes


def _stat_dict(st: os.stat_result) -> dict[str, Any]:
    """What getattr answers (times in ns: use_ns), with the ns fields kept for comparisons."""
    attrs = {name: getattr(st, name) for name in STAT_FIELDS}
    for name in ("st_atime", "st_mtime", "st_ctime"):
        attrs[name] = attrs[name + "_ns"]
    return attrs


class NfsClientView(mfusepy.Operations):
    use_ns = True

    def __init__(self, base: str, times: ClientTimes) -> None:
        self.base = base
        self.times = times
        self.guard = threading.Lock()
        self.attrs: dict[str, Cached] = {}
        self.negative: dict[str, float] = {}                 # path -> its parent's mtime_ns when found missing
        self.listings: dict[str, tuple[list[tuple[str, dict[str, int], int]], int]] = {}  # dir -> (entries, its mtime_ns then)
        self.handle_size: dict[int, int] = {}                 # open file -> the size this node believed at open

    # -- the caches ------------------------------------------------------------------------
    def _real(self, path: str) -> str:
        return self.base + path

    def _timeout(self, attrs: dict[str, Any]) -> float:
        return self.times.acdirmin if stat.S_ISDIR(attrs["st_mode"]) else self.times.acregmin

    def _fetch(self, path: str) -> dict[str, Any]:
        """Attributes from the server (the real directory), into the cache; ENOENT kept as a lookup."""
        try:
            attrs = _stat_dict(os.lstat(self._real(path)))
        except FileNotFoundError:
            with self.guard:
                self.attrs.pop(path, None)
                if self.times.lookupcache == "all":
                    parent = self.attrs.get(os.path.dirname(path))
                    self.negative[path] = parent.attrs["st_mtime_ns"] if parent else -1
            raise mfusepy.FuseOSError(errno.ENOENT) from None
        with self.guard:
            before = self.attrs.get(path)
            self.attrs[path] = Cached(attrs, time.monotonic())
            self.negative.pop(path, None)
        if stat.S_ISDIR(attrs["st_mode"]) and (before is None or before.attrs["st_mtime_ns"] != attrs["st_mtime_ns"]):
            self._forget_under(path, attrs["st_mtime_ns"])   # a directory seen changed: its lookups and listing go
        return attrs

    def _cached(self, path: str) -> dict[str, Any] | None:
        with self.guard:
            entry = self.attrs.get(path)
        if entry is not None and time.monotonic() - entry.at < self._timeout(entry.attrs):
            return entry.attrs
        return None

    def _directory_revalidated(self, directory: str) -> None:
        """The directory's attributes fetched anew (a changed mtime drops its lookups and listing)."""
        self._fetch(directory)

    def _forget_under(self, directory: str, mtime_ns: int) -> None:
        prefix = directory.rstrip("/") + "/"
        with self.guard:
            for name in [n for n, seen in self.negative.items() if n.startswith(prefix) and seen != mtime_ns
                         and "/" not in n[len(prefix):]]:
                del self.negative[name]
            listing = self.listings.get(directory)
            if listing is not None and listing[1] != mtime_ns:
                del self.listings[directory]

    def _negative_holds(self, path: str) -> bool:
        with self.guard:
            seen = self.negative.get(path)
        if seen is None:
            return False
        parent = os.path.dirname(path)
        if self._cached(parent) is None:   # the directory's attributes expired: look at it again
            try:
                self._directory_revalidated(parent)
            except mfusepy.FuseOSError:
                return True
        with self.guard:
            return path in self.negative

    def _changed_here(self, *paths: str) -> None:
        """This node changed these names: its own view of them and of their directories is exact."""
        for path in paths:
            with self.guard:
                self.attrs.pop(path, None)
                self.negative.pop(path, None)
            for directory in {os.path.dirname(path)}:
                try:
                    attrs = _stat_dict(os.lstat(self._real(directory)))
                except OSError:
                    continue
                with self.guard:
                    self.attrs[directory] = Cached(attrs, time.monotonic())
                    self.listings.pop(directory, None)

    @contextlib.contextmanager
    def _told_by_server(self, *paths: str) -> Iterator[None]:
        """A change this node asks of the server: whether it is made or refused (EEXIST, ENOENT,
        ENOTEMPTY), the reply tells the client what is there now, so its view of these names and
        their directories is exact afterwards, as an NFS client's is from the server's answer."""
        try:
            yield
        finally:
            self._changed_here(*paths)

    # -- lookups and attributes ------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        if fh is not None:
            return _stat_dict(os.fstat(fh))
        cached = self._cached(path)
        if cached is not None:
            return cached
        if self._negative_holds(path):
            raise mfusepy.FuseOSError(errno.ENOENT)
        return self._fetch(path)

    def access(self, path: str, amode: int) -> int:
        self.getattr(path)
        return 0

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._real(path))
        return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                  "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    # -- directories -----------------------------------------------------------------------
    def opendir(self, path: str) -> int:
        if self.times.cto:
            self._directory_revalidated(path)
        return 0

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        attrs = self._cached(path) or self._fetch(path)
        with self.guard:
            listing = self.listings.get(path)
        if listing is None or listing[1] != attrs["st_mtime_ns"]:
            # name, its type bits and inode, as a READDIR reply carries them (an inode of 0 is skipped)
            with os.scandir(self._real(path)) as entries:
                names = [(e.name, {"st_mode": _type_bits(e), "st_ino": e.inode()}, 0) for e in entries]
            listing = (names, attrs["st_mtime_ns"])
            with self.guard:
                self.listings[path] = listing
        here = {"st_mode": stat.S_IFDIR, "st_ino": attrs["st_ino"]}
        return [(".", here, 0), ("..", here, 0), *listing[0]]

    def mkdir(self, path: str, mode: int) -> int:
        with self._told_by_server(path):
            os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        self._changed_here(path)
        return 0

    # -- names -----------------------------------------------------------------------------
    def rename(self, old: str, new: str) -> int:
        with self._told_by_server(old, new):
            os.rename(self._real(old), self._real(new))
        return 0

    def link(self, target: str, source: str) -> int:
        with self._told_by_server(target, source):
            os.link(self._real(source), self._real(target))
        return 0

    def symlink(self, target: str, source: str) -> int:
        with self._told_by_server(target):
            os.symlink(source, self._real(target))
        return 0

    def unlink(self, path: str) -> int:
        with self._told_by_server(path):
            os.unlink(self._real(path))
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        with self._told_by_server(path):
            os.mknod(self._real(path), mode, dev)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        self._changed_here(path)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.lchown(self._real(path), uid, gid)
        self._changed_here(path)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._real(path), follow_symlinks=False)
        else:
            os.utime(self._real(path), ns=times, follow_symlinks=False)
        self._changed_here(path)
        return 0

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)
        self._changed_here(path)
        return 0

    # -- files -----------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        believed = (self._fetch(path) if self.times.cto else self.getattr(path))["st_size"]
        fd = os.open(self._real(path), flags & ~os.O_CREAT)
        with self.guard:
            self.handle_size[fd] = believed
        return fd

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._told_by_server(path):
            fd = os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with self.guard:
            self.handle_size[fd] = 0
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        data = os.pread(fh, size, offset)
        if not self.times.cto:   # the page cache of a client that trusted its attributes stops at their size
            with self.guard:
                believed = self.handle_size.get(fh)
            if believed is not None:
                data = data[:max(0, believed - offset)]
        return data

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        written = os.pwrite(fh, data, offset)
        with self.guard:
            self.handle_size[fh] = max(self.handle_size.get(fh, 0), offset + written)
        self._changed_here(path)
        return written

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0

    def release(self, path: str, fh: int) -> int:
        with self.guard:
            self.handle_size.pop(fh, None)
        os.close(fh)
        return 0


def serve(base: str, at: str, times: ClientTimes) -> None:
    """Mount the view in the foreground until unmounted (or killed)."""
    mfusepy.FUSE(NfsClientView(os.path.abspath(base), times), at, foreground=True, nothreads=False,
                 attr_timeout=0, entry_timeout=0, negative_timeout=0, hard_remove=True,
                 use_ino=True, allow_other=True, fsname="nfsview")


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], ClientTimes.parse(sys.argv[3] if len(sys.argv) > 3 else ""))

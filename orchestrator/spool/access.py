"""Who may read a run directory, and whose files its workers act on (run.toml [access]).

Modes are explicit, never left to the umask of whoever runs a command:
  * owner-only (the default): directories 0700, files 0600;
  * `[access] group = NAME`: the group may read: the run directory is NAME's and setgid, so every
    directory below inherits both (0750 + setgid), files are 0640.
Nobody but the owner can write in either mode; shards are never group- or world-writable.

Should a run be opened anyway (a chmod, an ACL, an old run made with umask 002), a worker still
acts only on tickets, batch files and registry files owned by the run's owner, root (who can
write anything anyway) or a user listed in `[access] trusted`: anything else is moved to
quarantine/ with a reason and an event, never run. The owner is read from the open file
(fstat), which costs no metadata operation beyond the read a claim makes anyway.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from collections.abc import Iterable
from pathlib import Path

from orchestrator.config import Access, ConfigError
from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

OWNER_ONLY = fsops.Modes(file=0o600, dir=0o700)
GROUP_READ = fsops.Modes(file=0o640, dir=0o2750)   # setgid: directories below inherit the group
ROOT_UID = 0
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH

_own_process = False


class AccessError(ConfigError):
    """This process may not act for the run (it runs as a user the run does not trust)."""


def own_process() -> None:
    """This process is one of ours (the CLI, a worker): once it opens a run, its umask follows the
    run's modes too, so files that libraries create (Parquet writers, logs, sandbox workspaces)
    get them as well. (A trainer's process keeps its umask: what it creates goes through fsops.)"""
    global _own_process
    _own_process = True


def modes_of(access: Access) -> fsops.Modes:
    return GROUP_READ if access.group else OWNER_ONLY


def open_for(paths: SpoolPaths, access: Access) -> None:
    """This process works on the run: its modes from now on, and its owners trusted."""
    use(access)
    trust(paths, Owners.of(paths, access))


def use(access: Access) -> None:
    """Create the run's files and directories with its modes from now on (in this process)."""
    fsops.set_modes(modes_of(access))
    if _own_process:
        os.umask(0o027 if access.group else 0o077)


def group_id(access: Access) -> int | None:
    if not access.group:
        return None
    try:
        return int(access.group) if access.group.isdigit() else grp.getgrnam(access.group).gr_gid
    except (KeyError, ValueError):
        raise ConfigError(f"run.toml [access] group = {access.group!r}: no such group on this host; name a group "
                          "the run's readers belong to (`getent group`), or set it to \"\" for owner-only") from None


def prepare(paths: SpoolPaths, access: Access) -> None:
    """Make (or bring back to) the run directory's modes: the root and the standard directories
    below it (an existing run's other files keep theirs; new ones get the run's)."""
    use(access)
    modes, gid = modes_of(access), group_id(access)
    fsops.create_dirs(paths.root)
    for directory in (paths.root, *paths.directories()):
        fsops.create_dirs(directory)
        if directory.stat().st_uid != os.geteuid():
            continue   # a trusted user updating run.toml: the owner's directories stay as the owner made them
        try:
            if gid is not None:
                os.chown(directory, -1, gid)   # before the chmod: a chown may clear setgid
            os.chmod(directory, modes.dir)
        except PermissionError:
            raise ConfigError(f"cannot give {directory} to group {access.group!r}: you are not a member of it "
                              f"(`id -Gn`); run.toml [access] group must be one of your groups") from None
    trust(paths, Owners.of(paths, access))


def loose_directories(directories: Iterable[Path]) -> list[tuple[Path, int]]:
    """Those of `directories` (each stat-ed: one metadata operation) in which someone other than
    their owner may create, rename or remove entries, with their modes: group or other write
    without the sticky bit. With it (`chmod g+wt`: how a queue is opened to trusted users) only a
    file's owner may move or remove it, so nobody can swap the owner's tickets; without it, what
    a queue holds may have been placed or swapped by anyone who can write there."""
    loose = []
    for directory in directories:
        fsops.count("stat")
        try:
            mode = directory.stat().st_mode
        except FileNotFoundError:
            continue
        if mode & OTHERS_WRITE and not mode & stat.S_ISVTX:
            loose.append((directory, stat.S_IMODE(mode)))
    return loose


def tighten(directories: Iterable[Path]) -> list[str]:
    """Take group and other write off each loose one of `directories` (its other bits kept);
    what was changed, one line each. AccessError naming the fix for one this user does not own."""
    changed = []
    for directory, mode in loose_directories(directories):
        tightened = mode & ~OTHERS_WRITE
        try:
            os.chmod(directory, tightened)
        except PermissionError:
            raise AccessError(
                f"{directory} is writable by {'its group' if mode & stat.S_IWGRP else 'others'} (mode {mode:04o}): "
                f"anyone who can write there could place or swap tickets; its owner should run "
                f"`chmod go-w {directory}` (or `chmod +t {directory}` to let trusted users add files)") from None
        changed.append(f"{directory}: mode {mode:04o} -> {tightened:04o} (others could place or swap files in it)")
    return changed


def working_directories(paths: SpoolPaths) -> list[Path]:
    """Every directory of the run whose files workers act on: what `launch` repairs."""
    return [paths.root, paths.queue, *paths.directories(), *paths.run_queues()]


def _uid_of(user: str) -> int:
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ConfigError(f"run.toml [access] trusted: no user {user!r} on this host (`getent passwd {user}`)") from None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no name"


@dataclass(frozen=True)
class Owners:
    """The uids whose files a worker of the run acts on: the run's owner, root, the trusted."""

    owner: int
    trusted: frozenset[int]

    @classmethod
    def of(cls, paths: SpoolPaths, access: Access) -> "Owners":
        fsops.count("stat")
        owner = paths.root.stat().st_uid
        return cls(owner, frozenset({owner, ROOT_UID, *(_uid_of(user) for user in access.trusted)}))

    def refusal(self, uid: int, path: Path) -> str | None:
        """Why a file owned by `uid` is not acted on (None: it is)."""
        if uid in self.trusted:
            return None
        return (f"{path} is owned by uid {uid} ({user_name(uid)}), who is neither the run's owner "
                f"(uid {self.owner}, {user_name(self.owner)}) nor listed in run.toml [access] trusted: "
                f"moved aside unread; if that user may submit to this run, add them there")

    def provenance(self, st: os.stat_result, path: Path) -> str | None:
        """Why the file with attributes `st` may have been written by someone the run does not
        trust (None: only a trusted user could have): its owner, anyone its mode lets write it,
        or a second name through which someone else may have placed or rewritten it."""
        owned = self.refusal(st.st_uid, path)
        if owned:
            return owned
        if st.st_mode & OTHERS_WRITE:
            return (f"{path} is writable by its {'group' if st.st_mode & stat.S_IWGRP else 'others'} "
                    f"(mode {stat.S_IMODE(st.st_mode):04o}): someone other than its owner may have rewritten it; "
                    f"moved aside unread (if you wrote it and trust its content: chmod go-w it and move it back)")
        if st.st_nlink != 1:
            return (f"{path} has {st.st_nlink} links: it may have been placed, or be rewritten, through "
                    f"another name; moved aside unread (spool files have exactly one name)")
        return None

    def check_self(self, paths: SpoolPaths) -> None:
        """AccessError when this process runs as a user the run does not trust: what it wrote
        (tickets it moves on, the registry) would be quarantined by the owner's workers."""
        me = os.getuid()
        if me not in self.trusted:
            raise AccessError(
                f"this worker runs as uid {me} ({user_name(me)}), but the run {paths.root} belongs to uid "
                f"{self.owner} ({user_name(self.owner)}): start workers as the owner, or list "
                f"{user_name(me)} in run.toml [access] trusted")


# The owners each run's workers in this process trust, by run directory (set by the worker).
_trusted: dict[Path, Owners] = {}


def trust(paths: SpoolPaths, owners: Owners) -> None:
    """From now on, files of this run read through read_trusted are held to `owners`."""
    _trusted[paths.root] = owners


def owners_of(paths: SpoolPaths) -> Owners | None:
    """The owners a worker of this process trusts for the run (None: no worker here, no check)."""
    return _trusted.get(paths.root)


def read_trusted(paths: SpoolPaths, path: Path, limit: int = fsops.TICKET_READ_LIMIT) -> tuple[bytes, str | None]:
    """(content, None), or (b"", why not) when the file may have been written by someone the run
    does not trust, or is no regular file at all (a link, a FIFO, a device, a directory): then
    nothing of it was read and the caller moves it aside with that reason. Checked on the open
    descriptor, before a byte is read."""
    return read_checked(_trusted.get(paths.root), path, limit)


def read_checked(owners: Owners | None, path: Path, limit: int = fsops.TICKET_READ_LIMIT) -> tuple[bytes, str | None]:
    """read_trusted with the owners given (None: no worker in this process; only the kind of
    file and its size are checked)."""
    try:
        fd, st = fsops.open_regular(path)
    except fsops.UnsafeSpoolFile as exc:
        return b"", f"{exc}: moved aside unread"
    try:
        refusal = owners.provenance(st, path) if owners is not None else None
        if refusal:
            return b"", refusal
        try:
            return fsops.read_open(fd, st, path, limit), None
        except fsops.UnsafeSpoolFile as exc:
            return b"", f"{exc}: moved aside unread"
    finally:
        os.close(fd)

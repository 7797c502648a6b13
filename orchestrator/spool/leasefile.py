"""A lease held in one file on the shared filesystem: exclusive create, renewed by mtime.

One holder at a time, across nodes, without flock: the file is created exclusively with the
holder's name in it, and the holder refreshes its mtime. A lease whose mtime is older than
`stale_s` is taken over: moved aside by rename (only one contender's rename succeeds), then
created again. A contender that moved a fresh lease by mistake (someone renewed or took it
over between its stat and its rename) puts it back with link(), which never overwrites.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.spool import fsops


@dataclass
class Lease:
    path: Path
    holder: str        # unique per process: host-pid-random
    stale_s: float

    def current_holder(self) -> str | None:
        """Who holds the lease (None: nobody; "" while a holder is still writing its name)."""
        try:
            return fsops.read_bytes(self.path).decode(errors="replace").strip()
        except FileNotFoundError:
            return None

    def held(self) -> bool:
        return self.current_holder() == self.holder

    def acquire(self) -> bool:
        """Hold the lease (renewing it if held already); False when another live holder has it."""
        if self.held():
            return self.renew()
        if fsops.create_exclusive(self.path, self.holder.encode()):
            return True
        age = self._age()
        if age is None:
            return fsops.create_exclusive(self.path, self.holder.encode())
        if age < self.stale_s:
            return False
        return self._take_over()

    def renew(self) -> bool:
        """Refresh the mtime; False (and nothing touched) when the lease is no longer ours."""
        if not self.held():
            return False
        try:
            fsops.touch(self.path)
        except FileNotFoundError:
            return False
        return True

    def release(self) -> None:
        if self.held():
            fsops.unlink(self.path)

    def _age(self) -> float | None:
        mtime = fsops.mtime(self.path)
        return None if mtime is None else time.time() - mtime

    def _take_over(self) -> bool:
        aside = self.path.with_name(f".{self.path.name}.taken-{self.holder}")
        if not fsops.rename(self.path, aside):
            return False               # another contender moved it first
        try:
            if time.time() - aside.stat().st_mtime < self.stale_s:
                try:                   # a fresh lease: not ours to take, put it back
                    os.link(aside, self.path)
                except FileExistsError:
                    pass
                return False
        finally:
            fsops.unlink(aside)
        return fsops.create_exclusive(self.path, self.holder.encode())

"""A unique loopback address (127.x.y.z, never 127.0.0.1) per live sandbox on this node.

Leases are files created with O_CREAT|O_EXCL in a node-wide directory, so two processes can
never take the same address (no read-modify-write of a shared table). A lease names its
owner (pid + start time); leases of dead owners are reclaimed. 127.0.0.0/16 is skipped:
127.0.0.1 is localhost and Debian maps the host name to 127.0.1.1.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
from pathlib import Path

from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.procs import ProcessId

FIRST = int(ipaddress.IPv4Address("127.1.0.1"))
LAST = int(ipaddress.IPv4Address("127.254.255.254"))
MAX_PROBES = 4096


def lease_dir() -> Path:
    override = os.environ.get("HPC_ROLLOUT_LOOPBACK_DIR")
    path = Path(override) if override else Path("/tmp/hpc-rollout-loopback")
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        try:  # shared by every user of the node, like /tmp itself
            os.chmod(path, 0o1777)
        except PermissionError:
            pass
    return path


def _usable(value: int) -> bool:
    last_octet = value & 0xFF
    return last_octet not in (0, 255)


def allocate(owner: ProcessId, sandbox_id: str) -> str:
    """Lease a free address for `sandbox_id`; raises SandboxError when none is found."""
    directory = lease_dir()
    rng = random.Random()
    # Random probing keeps concurrent allocators from colliding on the same first choice.
    for _ in range(MAX_PROBES):
        value = rng.randint(FIRST, LAST)
        if not _usable(value):
            continue
        address = str(ipaddress.IPv4Address(value))
        path = directory / address
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _reclaim_if_stale(path):
                continue  # freed: another probe may take it
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump({"owner": owner.to_json(), "sandbox": sandbox_id}, fh)
        return address
    raise SandboxError(
        f"no free loopback address after {MAX_PROBES} probes in {directory}; "
        "clean stale leases with `hpc-rollout sandbox sweep` or remove the directory"
    )


def release(address: str | None, sandbox_id: str | None = None) -> None:
    """Give the address back; with `sandbox_id`, only if the lease is still that sandbox's.

    The check matters when a close and a sweep race: the address may already have been
    released and leased again to a new sandbox, whose lease must survive.
    """
    if not address:
        return
    path = lease_dir() / address
    if sandbox_id is not None:
        try:
            if json.loads(path.read_text()).get("sandbox") != sandbox_id:
                return
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError):
            pass  # unreadable: ours to clean up
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _lease_owner(path: Path) -> ProcessId | None:
    try:
        data = json.loads(path.read_text())
        return ProcessId.from_json(data["owner"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _reclaim_if_stale(path: Path) -> bool:
    owner = _lease_owner(path)
    if owner is None:
        # Being written right now, or corrupt: only reclaim when clearly old.
        try:
            import time

            if time.time() - path.stat().st_mtime < 60:
                return False
        except FileNotFoundError:
            return True
    elif owner.alive():
        return False
    try:
        os.unlink(path)
    except (FileNotFoundError, PermissionError):
        return False
    return True


def reclaim_stale() -> int:
    """Remove leases whose owner process is gone; the sweep calls this."""
    directory = lease_dir()
    return sum(1 for path in directory.iterdir() if _reclaim_if_stale(path))


def leased() -> list[str]:
    return sorted(p.name for p in lease_dir().iterdir())

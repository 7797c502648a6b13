"""A unique loopback address (127.x.y.z, never 127.0.0.1) per live sandbox on this node.

Each address in use is a lease in a node-wide directory, taken and given back with the spool's
one lock algorithm (orchestrator/spool/lease.py): two processes can never take the same address,
and a release removes only its own sandbox's token, so a late release (a sweep racing a close)
never frees the next sandbox's address. The lease names its owner process (pid + start time):
a lease whose owner is gone is reclaimed at once, judged from /proc (this node's own processes),
not by waiting. 127.0.0.0/16 is skipped: 127.0.0.1 is localhost and Debian maps the host name to
127.0.1.1. Its file operations are node-local: they are charged to the fsops duty "node_local",
not to the job (they never reach a metadata server).
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
from pathlib import Path

from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.procs import ProcessId
from orchestrator.spool import fsops
from orchestrator.spool.lease import Lock, break_if_holder_gone, release_any, try_lock

FIRST = int(ipaddress.IPv4Address("127.1.0.1"))
LAST = int(ipaddress.IPv4Address("127.254.255.254"))
MAX_PROBES = 4096
NODE_LOCAL_DUTY = "node_local"


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
    with fsops.duty(NODE_LOCAL_DUTY):
        for _ in range(MAX_PROBES):
            value = rng.randint(FIRST, LAST)
            if not _usable(value):
                continue
            address = str(ipaddress.IPv4Address(value))
            if take(address, owner, sandbox_id):
                return address
            _reclaim_if_stale(directory / address)   # freed for a later probe, if its owner is gone
    raise SandboxError(
        f"no free loopback address after {MAX_PROBES} probes in {directory}; "
        "clean stale leases with `hpc-rollout sandbox sweep` or remove the directory"
    )


def take(address: str, owner: ProcessId, sandbox_id: str) -> bool:
    """Lease `address` for `sandbox_id` if it is free."""
    note = json.dumps({"owner": owner.to_json(), "sandbox": sandbox_id}).encode()
    return try_lock(lease_dir() / address, holder=sandbox_id, note=note) is not None


def release(address: str | None, sandbox_id: str | None = None) -> None:
    """Give the address back; with `sandbox_id`, only if the lease is still that sandbox's.

    The check matters when a close and a sweep race: the address may already have been
    released and leased again to a new sandbox, whose lease must survive.
    """
    if not address:
        return
    path = lease_dir() / address
    with fsops.duty(NODE_LOCAL_DUTY):
        if sandbox_id is None:
            release_any(path)
        else:
            Lock(path, holder=sandbox_id).release()


def _owner_gone(note: bytes) -> bool:
    try:
        owner = ProcessId.from_json(json.loads(note)["owner"])
    except (ValueError, KeyError, TypeError):
        return True   # a token appears whole (spool/lease.py): one that cannot be read is corrupt
    return owner is None or not owner.alive()


def _reclaim_if_stale(path: Path) -> bool:
    try:
        return break_if_holder_gone(path, _owner_gone)
    except PermissionError:
        return False   # another user's lease (the directory is sticky): theirs to reclaim


def reclaim_stale() -> int:
    """Remove leases whose owner process is gone; the sweep calls this."""
    with fsops.duty(NODE_LOCAL_DUTY):
        return sum(1 for address in leased() if _reclaim_if_stale(lease_dir() / address))


def leased() -> list[str]:
    return sorted(p.name for p in lease_dir().iterdir() if not p.name.startswith("."))

"""A sandbox backed by one runtime process (bwrap, apptainer, or a local server) and its record.

Closing: ask the execution server to shut down (tools stopped, server exits, so bwrap's
pid 1 ends and the kernel empties the pid namespace), wait briefly; then SIGKILL the
sandbox's pid 1 (from --json-status-fd: killing it first avoids bwrap's start-up race) and
the outer process group; then verify every recorded process is gone before cleaning up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from orchestrator.sandbox import cgroups, loopback
from orchestrator.sandbox.base import Sandbox
from orchestrator.sandbox.client import ExecClient
from orchestrator.sandbox.errors import SandboxClosedError, SandboxError
from orchestrator.sandbox.procs import ProcessId, live_members
from orchestrator.sandbox.options import WORKSPACE
from orchestrator.sandbox.records import SandboxRecord, remove_sandbox_dir
from orchestrator.sandbox.workspace import REMOVABLE_PREFIX, copy_out

log = logging.getLogger(__name__)

GRACEFUL_S = 1.0
CLOSING_MARK = "closing"
KILL_VERIFY_S = 5.0

# Popen objects of sandboxes this process started, so their exit status is collected.
_children: dict[int, subprocess.Popen[bytes]] = {}


def register_child(proc: subprocess.Popen[bytes]) -> None:
    _children[proc.pid] = proc


def reap_children() -> None:
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            _children.pop(pid, None)


async def wait_gone(processes: list[ProcessId], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        reap_children()
        if not any(p.alive() for p in processes):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


def kill_processes(record: SandboxRecord) -> None:
    """SIGKILL pid 1 of the sandbox first, then the outer process and its process group.

    `local` has no pid namespace: its tools' process groups (recorded by the server in
    tools.json) are killed too.
    """
    if record.kind == "local":
        for group in _local_tool_groups(record):
            if group.alive():
                try:
                    os.killpg(group.pid, signal.SIGKILL)
                except OSError:
                    pass
    for proc in record.processes():
        if proc.kill(signal.SIGKILL) and proc == ProcessId(*record.process):
            try:  # the outer process leads its own session (start_new_session)
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass


def _local_tool_groups(record: SandboxRecord) -> list[ProcessId]:
    try:
        with open(os.path.join(os.path.dirname(record.socket), "tools.json")) as fh:
            return [ProcessId(int(pid), int(start)) for pid, start in json.load(fh)]
    except (OSError, ValueError, TypeError):
        return []


def release_resources(record: SandboxRecord) -> bool:
    """Cgroup, loopback lease and runtime directory; False if the cgroup still has processes."""
    cgroup_gone = True
    for group in record.cgroup_paths():
        for pid in cgroups.pids_in(group):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        cgroup_gone = cgroups.remove(group) and cgroup_gone
    loopback.release(record.loopback, record.id)
    remove_sandbox_dir(record.runtime_dir)
    return cgroup_gone


class ProcessSandbox(Sandbox):
    def __init__(
        self, record: SandboxRecord, popen: subprocess.Popen[bytes] | None = None,
        status_fd: int | None = None,
    ) -> None:
        self.kind = record.kind
        self.record = record
        self.client = ExecClient(record.socket, record.secret)
        self._popen = popen
        self._status_fd = status_fd
        self._closed = False
        self._close_lock = asyncio.Lock()

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def loopback(self) -> str | None:
        return self.record.loopback

    @property
    def workspace(self) -> str:
        """The host directory holding the workspace: bound, or where a kept one is copied; else ""."""
        return self.record.workspace or self.record.workspace_keep

    @property
    def closed(self) -> bool:
        return self._closed

    def descriptor(self) -> dict[str, Any]:
        # No secret here: descriptors travel through the shared filesystem; the secret stays
        # in the node-local, owner-only record.
        return {
            "kind": self.kind, "id": self.record.id, "node": self.record.node,
            "runtime_dir": self.record.runtime_dir, "job_id": self.record.job_id,
            "loopback": self.record.loopback, "workspace": self.workspace,
            "workspace_removable": bool(self.record.workspace) and Path(self.record.workspace).name.startswith(REMOVABLE_PREFIX),
        }

    def alive(self) -> bool:
        reap_children()
        return all(p.alive() for p in self.record.processes())

    async def call(self, tool: str, args: dict[str, Any], *, fresh: bool = False) -> dict[str, Any]:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.record.id} is closed; open a new one")
        try:
            return await self.client.call(tool, args, fresh=fresh)
        except SandboxClosedError:
            if not self.alive():
                raise SandboxClosedError(
                    f"sandbox {self.record.id} ({self.kind}) died; its server log: "
                    f"{self.record.runtime_dir}/server.log"
                ) from None
            raise

    async def _keep_workspace(self) -> None:
        """Copy a kept in-sandbox workspace out while the sandbox still lives (workspace.py)."""
        if not self.record.workspace_keep or not self.record.child or not self.alive():
            if self.record.workspace_keep:
                log.warning("sandbox %s: workspace not kept, the sandbox is gone already", self.id)
            return
        source = Path(f"/proc/{self.record.child[0]}/root{WORKSPACE}")
        cap = self.record.workspace_mb << 20
        try:
            report = await asyncio.to_thread(copy_out, source, Path(self.record.workspace_keep), cap)
            log.info("sandbox %s: workspace kept in %s (%d files, %d bytes)", self.id,
                     self.record.workspace_keep, report.files, report.bytes)
        except OSError as exc:
            log.warning("sandbox %s: could not keep its workspace: %s", self.id, exc)

    async def _end_local_tools(self) -> None:
        """`local` has no pid namespace that dies with its server: its tools' groups are killed
        with it, but a SIGKILLed process takes a moment to finish (longer on a busy machine).
        Return only once none of them runs, so that no tool outlives the sandbox's close."""
        groups = {group.pid for group in _local_tool_groups(self.record)}
        if not groups:
            return
        kill_processes(self.record)   # the graceful path: the server may have left its tools
        deadline = time.monotonic() + KILL_VERIFY_S
        while (left := live_members(groups)) and time.monotonic() < deadline:
            reap_children()
            await asyncio.sleep(0.01)
        if left:
            raise SandboxError(f"sandbox {self.record.id}: tool processes {left} survived SIGKILL for "
                               f"{KILL_VERIFY_S} s; check `ps` and the kernel log")

    async def close(self) -> None:
        async with self._close_lock:
            if self._closed:
                return
            try:  # tells a concurrent sweep that this sandbox is being closed by someone
                Path(self.record.runtime_dir, CLOSING_MARK).touch()
            except OSError:
                pass
            processes = self.record.processes()
            await self._keep_workspace()
            if any(p.alive() for p in processes):
                try:
                    await asyncio.wait_for(self.client.call("shutdown", {}, fresh=True), GRACEFUL_S)
                except (SandboxError, OSError, asyncio.TimeoutError, ValueError):
                    pass
                if not await wait_gone(processes, GRACEFUL_S):
                    kill_processes(self.record)
                    if not await wait_gone(processes, KILL_VERIFY_S):
                        raise SandboxError(
                            f"sandbox {self.record.id}: processes {[p.pid for p in processes]} "
                            f"survived SIGKILL for {KILL_VERIFY_S} s; check `ps` and the kernel log"
                        )
            if self.record.kind == "local":
                await self._end_local_tools()
            await self.client.close()
            if self._popen is not None:
                self._popen.poll()
            if self._status_fd is not None:
                os.close(self._status_fd)
                self._status_fd = None
            if not release_resources(self.record):
                log.warning("cgroup %s of sandbox %s not removable yet", self.record.cgroup, self.id)
            self._closed = True

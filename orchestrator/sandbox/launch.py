"""Start one sandbox: runtime dir, lease, cgroup, process, handshake, record.

The runtime process is created in the calling thread (the worker's event loop): bwrap's
--die-with-parent uses PR_SET_PDEATHSIG, which fires when the *thread* that forked it
exits, so it must not be forked from a short-lived executor thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from orchestrator.spool.paths import SpoolPaths, current_node
from orchestrator.sandbox import cgroups, loopback
from orchestrator.sandbox.errors import SandboxStartError
from orchestrator.sandbox.process import (
    ProcessSandbox, kill_processes, register_child, release_resources, wait_gone,
)
from orchestrator.process_start import start_time
from orchestrator.sandbox.procs import ProcessId
from orchestrator.sandbox.records import SandboxRecord, new_sandbox_dir, remove_sandbox_dir
from orchestrator.sandbox.limits import MiB
from orchestrator.sandbox.runtime import SandboxRuntime
from orchestrator.sandbox.spec import INSIDE_RUN, LaunchSpec
from orchestrator.sandbox.workspace import host_workspace, kept_copy

log = logging.getLogger(__name__)

async def _read_line(fd: int, timeout: float) -> bytes:
    """One line from a pipe without blocking the event loop (no executor threads)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    buffer = b""
    deadline = loop.time() + timeout
    while b"\n" not in buffer:
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, ready)
        try:
            await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise TimeoutError from None
        finally:
            loop.remove_reader(fd)
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if not chunk:
            break
        buffer += chunk
    return buffer


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


def _log_tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:].strip()


@dataclass(frozen=True)
class _Reserved:
    """What a sandbox holds before its process starts; all of it given back if the start fails."""

    sandbox_id: str
    runtime_dir: Path
    workspace: Path | None
    created: Path | None   # a host workspace made for this sandbox (removed if the start fails)
    keep_to: str           # where a tmpfs workspace is copied when kept
    address: str
    groups: cgroups.SandboxGroups | None


async def launch(runtime: SandboxRuntime, *, job_id: str, paths: SpoolPaths) -> ProcessSandbox:
    """Start the runtime process and wait until its execution server is ready.

    What differs between runtimes (workspace mount, environment, child pid, cgroup) is stated by
    `runtime` (runtime.py); everything else is the same for all of them.
    """
    options = runtime.options
    owner = ProcessId.current()
    reserved = _reserve(runtime, job_id, paths, owner)
    status_r = status_w = None
    if runtime.reports_child_pid:
        status_r, status_w = os.pipe()
    spec = LaunchSpec(
        sandbox_id=reserved.sandbox_id, job_id=job_id, runtime_dir=reserved.runtime_dir,
        socket_dir=reserved.runtime_dir / "s", workspace=reserved.workspace, options=options,
        loopback=reserved.address, status_fd=status_w,
    )
    record = _record_of(runtime, reserved, spec, owner)
    proc: subprocess.Popen[bytes] | None = None
    try:
        runtime.prepare(spec)
        argv = runtime.argv(spec)
        proc = _spawn(runtime, argv, reserved, status_w)
        register_child(proc)
        if status_w is not None:
            os.close(status_w)
            status_w = None
        record = _with(record, process=ProcessId(proc.pid, _start_of(proc.pid)).to_json())
        record.save()
        _send_config(proc, _server_config(runtime, spec, record, reserved))
        await _await_ready(proc, runtime, argv, reserved.runtime_dir)
        if status_r is not None:
            record = _with_child(record, status_r, block=True)
        record.save()
        return ProcessSandbox(record, popen=proc, status_fd=status_r)
    except BaseException:
        # Covers cancellation too: nothing may outlive a failed start.
        await _abort_start(proc, record, status_r, status_w, reserved.created)
        raise


def _reserve(runtime: SandboxRuntime, job_id: str, paths: SpoolPaths, owner: ProcessId) -> _Reserved:
    """The runtime dir, the workspace, a loopback address and the cgroups of a new sandbox."""
    options = runtime.options
    sandbox_id, runtime_dir = new_sandbox_dir()
    address: str | None = None
    groups: cgroups.SandboxGroups | None = None
    workspace: Path | None = options.workspace
    created: Path | None = None
    keep_to = ""
    try:
        if workspace is not None:
            workspace.mkdir(parents=True, exist_ok=True)
        elif runtime.mounts_tmpfs_workspace:
            keep_to = str(kept_copy(paths, job_id, sandbox_id)) if options.keep_workspace else ""
        else:
            workspace = created = host_workspace(paths, job_id, sandbox_id, options.keep_workspace)
            workspace.mkdir(parents=True)
        address = loopback.allocate(owner, sandbox_id)
        if options.cgroup and runtime.confinable:
            groups = cgroups.create(sandbox_id, options.limits.processes, options.limits.total_memory_mb * MiB)
    except BaseException:
        loopback.release(address)
        for group in groups.paths() if groups else []:
            cgroups.remove(group)
        remove_sandbox_dir(runtime_dir)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    return _Reserved(sandbox_id, runtime_dir, workspace, created, keep_to, address, groups)


def _record_of(runtime: SandboxRuntime, reserved: _Reserved, spec: LaunchSpec, owner: ProcessId) -> SandboxRecord:
    """The sandbox's record before its process exists (what cleanup finds if the worker dies)."""
    limits, groups, workspace = runtime.options.limits, reserved.groups, reserved.workspace
    memory_group = groups.memory if groups is not None and groups.memory != groups.pids else None
    return SandboxRecord(
        id=reserved.sandbox_id, kind=runtime.name.value, job_id=spec.job_id, node=current_node(),
        runtime_dir=str(reserved.runtime_dir), socket=str(spec.socket_dir / "sock"),
        secret=secrets.token_hex(16), owner=owner.to_json(), process=[0, 0], child=None,
        loopback=reserved.address, cgroup=str(groups.pids) if groups else None,
        deadline=time.time() + limits.wall_clock_s, workspace=str(workspace) if workspace else "",
        memory_cgroup=str(memory_group) if memory_group else None, workspace_keep=reserved.keep_to,
        workspace_mb=limits.workspace_mb,
    )


def _server_config(runtime: SandboxRuntime, spec: LaunchSpec, record: SandboxRecord,
                   reserved: _Reserved) -> dict[str, object]:
    """What the execution server reads on its stdin: its secret, socket, working dir, env, limits."""
    limits, inside_workspace = runtime.options.limits, runtime.inside_workspace
    workdir = inside_workspace or str(reserved.workspace)
    memory_capped = reserved.groups is not None and reserved.groups.memory is not None
    return {
        "secret": record.secret, "socket": f"{INSIDE_RUN}/sock" if inside_workspace else record.socket,
        "cwd": workdir, "env": spec.sandbox_env(workdir),
        "rlimits": limits.rlimits(memory_cgroup=memory_capped), "wall_clock_s": limits.wall_clock_s,
        "command_timeout_s": limits.command_timeout_s,
    }


def _spawn(runtime: SandboxRuntime, argv: list[str], reserved: _Reserved, status_w: int | None) -> subprocess.Popen[bytes]:
    """The runtime process, in its own session (its process group is the sandbox's), in the cgroups."""
    procs = cgroups.procs_files(reserved.groups)
    with open(reserved.runtime_dir / "server.log", "wb") as log_file:
        return subprocess.Popen(
            cgroups.joining_argv(procs, argv) if procs else argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log_file, pass_fds=(status_w,) if status_w is not None else (),
            start_new_session=True, cwd=str(reserved.workspace or reserved.runtime_dir),
            env=dict(os.environ) if runtime.needs_host_env else
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
        )


def _send_config(proc: subprocess.Popen[bytes], config: dict[str, object]) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(orjson.dumps(config) + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: the ready line is EOF and its log is reported


async def _await_ready(proc: subprocess.Popen[bytes], runtime: SandboxRuntime, argv: list[str], runtime_dir: Path) -> None:
    """Wait for the server's READY line; SandboxStartError with its log when it never comes."""
    assert proc.stdout is not None
    kind, timeout = runtime.name.value, runtime.options.start_timeout_s
    try:
        line = await _read_line(proc.stdout.fileno(), timeout)
    except TimeoutError:
        raise SandboxStartError(
            f"{kind} sandbox not ready after {timeout} s; "
            f"server log: {_log_tail(runtime_dir / 'server.log') or '(empty)'}"
        ) from None
    if not line.startswith(b"READY"):
        proc.poll()
        raise SandboxStartError(
            f"{kind} sandbox failed to start (exit status {proc.returncode}); command: "
            f"{' '.join(argv[:3])} ...; its output: "
            f"{_log_tail(runtime_dir / 'server.log') or line.decode(errors='replace') or '(none)'}"
        )
    proc.stdout.close()


def _with_child(record: SandboxRecord, status_r: int, block: bool) -> SandboxRecord:
    """The record with the runtime's child (the sandboxed init), when the runtime reported it."""
    child_pid = _child_pid(status_r, block=block)
    return _with(record, child=[child_pid, _start_of(child_pid)]) if child_pid else record


async def _abort_start(proc: subprocess.Popen[bytes] | None, record: SandboxRecord, status_r: int | None,
                       status_w: int | None, created: Path | None) -> None:
    """Undo a start that failed or was cancelled: its processes killed, everything it held given back."""
    if proc is not None:
        if status_r is not None and record.child is None:
            record = _with_child(record, status_r, block=False)
        kill_processes(record)
        await wait_gone(record.processes(), 5.0)
        proc.poll()
    if status_r is not None:
        os.close(status_r)
    if status_w is not None:
        os.close(status_w)
    release_resources(record)
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


def _start_of(pid: int) -> int:
    return start_time(pid) or 0  # 0 never matches: a process already gone counts as dead


def _child_pid(fd: int, block: bool = True) -> int | None:
    """bwrap writes {"child-pid": N} first on --json-status-fd."""
    os.set_blocking(fd, block)
    try:
        data = os.read(fd, 4096)
    except (BlockingIOError, OSError):
        return None
    for line in data.splitlines():
        try:
            info = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(info, dict) and "child-pid" in info:
            return int(info["child-pid"])
    return None


def _with(record: SandboxRecord, **changes: object) -> SandboxRecord:
    from dataclasses import replace

    return replace(record, **changes)  # type: ignore[arg-type]

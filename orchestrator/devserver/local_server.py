"""Start `serve-llm` as a subprocess for demos and tests, and always stop it.

    with local_server(tiny=True, record=path) as url:   # url = http://127.0.0.1:PORT/v1
        ...

The server runs in its own process group; on exit that group is sent SIGTERM, then
SIGKILL after a grace period. Nothing is ever stopped by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

import orchestrator
from orchestrator.devserver.cpus import confine_to
from orchestrator.errors import HpcRolloutError

REPO_ROOT = Path(orchestrator.__file__).resolve().parent.parent


class ServerStartError(HpcRolloutError, RuntimeError):
    """serve-llm exited or stayed silent before it was healthy."""


@dataclass
class LocalServer:
    process: subprocess.Popen[str]
    url: str
    log_path: Path | None = None
    temp_log: bool = False
    scratch: Path | None = None     # a directory of the server's own, removed once it stopped
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after `grace_s`. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        signal_group(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait(grace_s)
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self.temp_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def kill(self) -> None:
        """Crash it now (SIGKILL), as a failing backend would."""
        signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.stop()


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the server is its own group leader (start_new_session)
    except ProcessLookupError:
        pass


def start_server(
    *, tiny: bool = True, model_dir: Path | None = None, host: str = "127.0.0.1", port: int = 0,
    record: Path | None = None, extra_args: Sequence[str] = (), log_path: Path | None = None,
    timeout_s: float = 180.0, threads: int | None = 1, cpus: set[int] | None = None,
) -> LocalServer:
    """Launch serve-llm and wait until GET /health answers 200; `cpus`: confine it (and all its
    threads) to those CPUs (orchestrator.devserver.cpus), else it may use any."""
    args = [sys.executable, "-m", "orchestrator.cli.serve_llm", "--host", host, "--port", str(port)]
    args += ["--tiny"] if tiny else ["--model", str(model_dir)]
    if record is not None:
        args += ["--record", str(record)]
    if threads:
        args += ["--threads", str(threads)]
    args += list(extra_args)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    temp_log = log_path is None
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="serve-llm-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    with open(log_path, "ab") as stderr:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                                   start_new_session=True,
                                   preexec_fn=None if cpus is None else lambda: confine_to(cpus))
    server = LocalServer(process, "", log_path, temp_log)
    try:
        server.url = wait_ready(process, timeout_s)
    except ServerStartError as exc:
        signal_group(process.pid, signal.SIGKILL)  # it never served: nothing to drain
        process.wait(10)
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        server.stop()
        raise ServerStartError(f"{exc}\n--- {log_path} (last lines) ---\n" + "\n".join(tail)) from None
    except BaseException:
        server.stop()
        raise
    return server


def wait_ready(process: subprocess.Popen[str], timeout_s: float) -> str:
    """Read the `serving ... on URL` line, then poll /health."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + timeout_s
    reader.join(timeout_s)
    if not line or " on http" not in line[0]:
        code = process.poll()
        raise ServerStartError(
            f"serve-llm did not start (exit code {code}); run it by hand to see why: "
            f"python -m orchestrator.cli.serve_llm --tiny --port 0"
        )
    url = line[0].strip().rsplit(" on ", 1)[1]
    root = url.removesuffix("/v1")
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartError(f"serve-llm exited with code {process.returncode} before it was healthy")
        try:
            if httpx.get(f"{root}/health", timeout=2.0).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise ServerStartError(f"serve-llm at {url} not healthy after {timeout_s:.0f} s")


@contextmanager
def local_server(**options: object) -> Iterator[str]:
    """Context manager yielding the base URL (…/v1) of a running serve-llm; stops it on exit."""
    server = start_server(**options)  # type: ignore[arg-type]
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def local_servers(count: int, **options: object) -> Iterator[list[LocalServer]]:
    """Several servers at once (their start-up overlaps); all stopped on exit."""
    servers: list[LocalServer] = []
    try:
        for _ in range(count):
            servers.append(start_server(**options))  # type: ignore[arg-type]
        yield servers
    finally:
        for server in servers:
            server.stop()

"""Claude Code and Codex CLI reach nothing but the job's proxy: each CLI of the `harness` image runs
one task with its preset (harness_clis.py) through the relay to a proxy of this process (the
scripted serve-llm behind it), in a network namespace of its own, under strace. Every connect()
and sendto() it makes is to the relay (loopback, the relay's port), the proxy's socket or the
local name-service cache: no DNS query, no other address, so no telemetry, error report, update
check or plugin sync is even attempted. Without the preset's switches the same run of Claude
Code does look names up (what makes the check able to fail).

The binaries are the image's (Claude Code's native binary, Codex's static musl binary), run on the
host: the check concerns the CLIs' settings; that a sandbox has no network is tested in
test_proxy.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cli_host import prepare
from hpc_rollout.handlers.harness_clis import PRESETS, CliSettings
from orchestrator.proxy.recorder import ProxyLimits
from orchestrator.proxy.server import new_proxy_dir
from tests.proxy.agent_clis import harness_image_for_tests
from tests.proxy.conftest import Backend
from tests.proxy.jobs import Job

pytestmark = [pytest.mark.llm, pytest.mark.skipif(
    shutil.which("strace") is None or shutil.which("unshare") is None,
    reason="needs strace and unshare (scripts/test.sh installs strace)")]

SETTINGS = CliSettings("policy", 4, 60000, 64)


@pytest.fixture(scope="module")
def harness_image() -> Path:
    return harness_image_for_tests()


def destinations(trace: str) -> Counter[str]:
    """connect()/sendto() destinations in an strace log: inet HOST:PORT or unix PATH."""
    found: Counter[str] = Counter()
    for line in trace.splitlines():
        if "connect(" not in line and "sendto(" not in line:
            continue
        inet = re.search(r'sin6?_port=htons\((\d+)\).*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")', line)
        unix = re.search(r'sun_path="([^"]+)"', line)
        if inet:
            found[f"inet {inet.group(2) or inet.group(3)}:{inet.group(1)}"] += 1
        elif unix:
            found[f"unix {unix.group(1)}"] += 1
    return found


def run_traced(cli: str, image: Path, job: Job, tmp: Path, *, switches: bool = True) -> tuple[int, str, Counter[str]]:
    """One task of `cli` through the relay to `job`'s proxy, under strace, in a new network namespace."""
    home = tmp / f"home-{cli}-{switches}"
    trace = home / "strace.log"
    run = prepare(cli, image, home, "Task sandbox.", job.directory, SETTINGS, switches=switches, trace=trace)
    done = subprocess.run(run.argv, env=run.env, cwd=run.cwd, capture_output=True, text=True, timeout=240)
    return done.returncode, done.stdout + done.stderr, destinations(trace.read_text())


def only_the_proxy(found: Counter[str], job: Job) -> dict[str, int]:
    """What of `found` is neither the relay on loopback, the proxy's socket nor the name-service cache."""
    allowed = {f"unix {job.socket}", "unix /var/run/nscd/socket", "unix /run/nscd/socket"}

    def relay(destination: str) -> bool:
        return destination.startswith("inet 127.0.0.1:") and not destination.endswith(":53")

    return {k: v for k, v in found.items() if k not in allowed and not relay(k)}


@pytest.mark.parametrize("cli", sorted(PRESETS))
def test_each_cli_reaches_only_the_jobs_proxy(cli: str, harness_image: Path, backend: Backend, tmp_path: Path) -> None:
    with Job(backend, new_proxy_dir(tmp_path / "px"), f"job-{cli}", limits=ProxyLimits(4, 60000, 64)) as job:
        code, output, found = run_traced(cli, harness_image, job, tmp_path)
        assert job.recorder is not None
        calls = len(job.recorder.calls)
    assert code == 0 and "hello from the policy" in output, output[-2000:]
    assert calls == 1
    assert f"unix {job.socket}" in found and any(k.startswith("inet 127.0.0.1:") for k in found), found
    assert only_the_proxy(found, job) == {}, found


def test_without_its_switches_claude_code_looks_names_up(harness_image: Path, backend: Backend, tmp_path: Path) -> None:
    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-bare", limits=ProxyLimits(4, 60000, 64)) as job:
        code, output, found = run_traced("claude-code", harness_image, job, tmp_path, switches=False)
    assert code == 0, output[-2000:]
    stray: dict[str, Any] = only_the_proxy(found, job)
    assert any(k.endswith(":53") for k in stray), found   # DNS for its telemetry and error reporting hosts

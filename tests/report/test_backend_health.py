"""A dead backend is in plain sight: `status` (text and --json) and `launch --wait` show the backends'
states and, while none is usable, since when jobs have been waiting for one (issue 24, item 5)."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

from orchestrator.config import RunConfig
from orchestrator.llm.registry import BackendRegistry, BackendState
from orchestrator.report.backend_health import backend_health
from tests.core.util import cli, make_run, start_worker, stop_worker, wait_until, write_jsonl

CHATS = [{"handler": "chat", "instance": {"messages": [{"role": "user", "content": f"hi {i}"}]}} for i in range(2)]


def dead_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/v1"   # nothing listens once closed


def test_states_and_since_when_no_backend_is_usable(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"llm.probe_after_s": 60.0})
    config = RunConfig.load(paths.run_config)
    registry = BackendRegistry.of(paths)
    first, second = registry.add("http://node1:8000/v1"), registry.add("http://node2:8000/v1")
    assert backend_health(paths, config).outage() is None
    registry.set_state(first.url, BackendState.DOWN, "refused")
    assert backend_health(paths, config).outage() is None, "one backend is still usable"
    time.sleep(0.05)
    before = time.time()
    registry.set_state(second.url, BackendState.DOWN, "refused")
    health = backend_health(paths, config)
    assert [b.state for b in health.backends] == ["down", "down"] and health.counts() == "2 down"
    assert health.unusable_since is not None and before <= health.unusable_since <= time.time()
    clock = time.strftime("%H:%M:%S", time.localtime(health.unusable_since))
    assert health.outage() == (f"no usable backend since {clock}: jobs waiting (each up to outage_wait_s = "
                               f"{config.llm.outage_wait_s:g} s, then it fails); `hpc-rollout backend list` says why")
    later = backend_health(paths, config, now=time.time() + 61)
    assert [b.state for b in later.backends] == ["probing", "probing"], "down past probe_after_s: tried again"
    assert later.unusable_since == health.unusable_since
    registry.set_state(first.url, BackendState.UP)
    assert backend_health(paths, config).outage() is None


def test_status_shows_a_dead_backend_while_jobs_wait_for_it(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"llm.outage_wait_s": 120.0})
    url = dead_url()
    BackendRegistry.of(paths).add(url)
    cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", CHATS)))
    worker = start_worker(paths)
    try:
        registry = BackendRegistry.of(paths)
        wait_until(lambda: registry.read().backends[0].state is BackendState.DOWN, 60, "the worker to mark it down")
        shown = cli("status", str(paths.root)).stdout
        assert url in shown and re.search(r"backends: 1 down", shown), shown
        assert "no usable backend since" in shown and "jobs waiting" in shown and "outage_wait_s = 120 s" in shown, shown
        data = json.loads(cli("status", str(paths.root), "--json").stdout)
        assert data["backends"]["backends"][0]["url"] == url and data["backends"]["backends"][0]["state"] == "down"
        assert data["backends"]["unusable_since"] is not None
    finally:
        stop_worker(worker)


def test_launch_wait_says_so_once_as_it_starts(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"llm.outage_wait_s": 2.0})
    registry = BackendRegistry.of(paths)
    url = registry.add(dead_url()).url
    registry.set_state(url, BackendState.DOWN, "connection refused")
    cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", CHATS)))
    done = cli("launch", str(paths.root), "--local", "--wait", check=False, timeout=300)
    assert done.returncode == 1, done.stderr   # the jobs failed after waiting outage_wait_s
    first = done.stderr.splitlines()[0]
    assert first.startswith("warning: no usable backend since") and "outage_wait_s = 2 s" in first, done.stderr
    assert "NoBackendAvailable" not in first


def test_no_backend_registered_says_nothing_of_backends(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])))
    done = cli("launch", str(paths.root), "--local", "--wait", timeout=300)
    shown = done.stdout + done.stderr + cli("status", str(paths.root)).stdout
    assert "backends" not in shown and "usable backend" not in shown, shown

"""Fixtures of the proxy tests: one scripted serve-llm per module (real tokenizer, real HTTP,
a record of every generation), a spool with it registered, and a private sandbox runtime dir
checked for leftovers."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from tests.agents.conftest import bundled, needs_bwrap, task_image  # noqa: F401
from tests.sandbox.conftest import private_runtime, spool  # noqa: F401  (autouse: no sandbox left behind)


@dataclass
class Backend:
    server: LocalServer
    record: Path
    paths: SpoolPaths

    def records(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.record.read_bytes().splitlines() if line.strip()]


def scripted_backend(tmp: Path, scripts: list[dict[str, Any]], **settings: Any) -> Iterator[Backend]:
    script_file = tmp / "scripts.jsonl"
    script_file.write_text("".join(json.dumps(s) + "\n" for s in scripts))
    record = tmp / "record.jsonl"
    server = start_server(tiny=True, record=record,
                          extra_args=["--scripted", str(script_file), "--max-model-len", "32768"])
    try:
        paths, _ = init_run(tmp / "run", {"shards.idle_flush_s": 0.1, "shards.max_age_s": 0.5, **settings})
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=3)
        yield Backend(server, record, paths)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """One scripted server for the proxy tests and the harness runs (their scripts match apart)."""
    from tests.proxy.scripts import all_scripts

    yield from scripted_backend(tmp_path_factory.mktemp("proxy"), all_scripts())


@pytest.fixture
def job(backend: Backend, tmp_path: Path) -> Iterator[Any]:
    """One job's proxy (tests/proxy/jobs.py) on the session's scripted server."""
    from orchestrator.proxy.server import new_proxy_dir
    from tests.proxy.jobs import Job

    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-a") as running:
        yield running


@pytest.fixture
def short_runtime() -> Iterator[Path]:
    """A worker's runtime base with a short path: a job's proxy socket sits two levels below its
    sandbox's (sb/ID/s/llm/proxy.sock) and socket paths are limited to 108 bytes."""
    base = Path(tempfile.mkdtemp(prefix="hr-"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def proxy_leftovers(runtime: Path) -> list[str]:
    """Whatever of a job's proxy is still under a worker's runtime directory."""
    names = ("proxy.sock", "token", "relay.py")
    return sorted(str(p) for p in runtime.rglob("*") if p.name in names or p.parent.name in ("px", "llm"))


__all__ = ["Backend", "scripted_backend", "proxy_leftovers", "short_runtime", "needs_bwrap", "bundled", "task_image", "private_runtime", "spool"]

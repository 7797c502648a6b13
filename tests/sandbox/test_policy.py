"""Operator policy, not row policy (issue 22, item 1): the image, network, binds and limits of a
job's sandbox come from run.toml; a task row only chooses among what the operator allowed. What
it may not have is refused at `submit` (FILE:LINE: reason) and again when a worker starts the
job (a ticket planted in the queue without `submit`)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.sandbox.policy import SandboxPolicy, SandboxPolicyError
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths, current_node
from orchestrator.spool.tickets import Ticket
from orchestrator.submission.submit import stage_and_publish, submit_rows
from tests.core.util import cli, drain_with_a_worker, make_run, rows, write_jsonl
from tests.sandbox.helpers import needs_bwrap

SHADOW = "head -c 200 /etc/shadow; ls -la /root"


def submitted(paths: SpoolPaths, handler: str, instance: dict[str, Any]) -> Any:
    return submit_rows(paths, [(1, {"handler": handler, "instance": instance})], source="rows.jsonl")


def plant(paths: SpoolPaths, handler: str, instance: dict[str, Any]) -> str:
    """A ticket put into queue/init/ by hand, the way someone who skips `submit` would."""
    job = JobSpec(job_id="20250101T000000000-beef-0000000-0000", group_id="20250101T000000000-beef-0000000",
                  instance_id="planted", sample_index=0, handler=handler, instance=instance,
                  submission_id="20250101T000000000-beef", submitted_at=time.time())
    names, _ = stage_and_publish(paths, "planted", [Ticket(job=job, enqueued_at=time.time())])
    return names[0]


def only_row(paths: SpoolPaths) -> dict[str, Any]:
    [row] = rows(paths)
    return row


# -- the image ------------------------------------------------------------------------------
def test_the_host_root_as_image_is_refused_at_submit_with_file_and_line(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    report = submitted(paths, "shell", {"commands": [SHADOW], "image": "/"})
    assert report.jobs == 0
    [problem] = report.rejected
    assert problem.line == 1
    assert "image /" in problem.reason and "sandbox.allowed_images" in problem.reason, problem.reason
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"commands": ["true"]}, {"commands": [SHADOW], "image": "/"}])
    done = cli("submit", str(paths.root), str(tasks), "--handler", "shell", check=False)
    assert done.returncode == 1
    assert f"{tasks}:2: " in done.stderr and "host's root" in done.stderr, done.stderr


@needs_bwrap
def test_a_planted_ticket_asking_for_the_host_root_is_refused_when_a_worker_starts_it(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"sandbox.runtime": "bwrap"})
    plant(paths, "shell", {"commands": [SHADOW], "image": "/"})
    drain_with_a_worker(paths)
    row = only_row(paths)
    assert row["status"] == "failed" and row["error_stage"] == "init", row
    assert "SandboxPolicyError" in row["error"] and "image /" in row["error"], row["error"]
    assert "root:" not in (row["result"] or ""), "the host's /etc/shadow reached the shard"
    events = [json.loads(line) for f in paths.events.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert not [e for e in events if e.get("event") == "sandbox_started"], "a sandbox was started for it"


def test_an_image_the_operator_allowed_may_be_chosen_and_nothing_outside_it(tmp_path: Path) -> None:
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (images / "escape").symlink_to(tmp_path / "elsewhere")
    policy = SandboxPolicy.of_settings(allowed_images=(str(images),))
    chosen = policy.decide({}, {"image": str(images / "a")}, handler="shell")
    assert chosen["image"] == str((images / "a").resolve())
    for outside in ("/", str(images / ".." / "elsewhere"), str(images / "escape"), "/usr"):
        with pytest.raises(SandboxPolicyError, match="allowed_images"):
            policy.decide({}, {"image": outside}, handler="shell")
    # The run's own default image is the operator's: always fine.
    assert policy.decide({"image": "/opt/default"}, {"image": "/opt/default"}, handler="shell")["image"] == "/opt/default"


# -- binds ----------------------------------------------------------------------------------
def test_an_rw_bind_outside_the_jobs_workspace_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    harness = {"problem": "1+1?", "answer": "2", "harness": {"command": "true", "binds": ["/root:/hostroot:rw"]}}
    paths = make_run(tmp_path / "run", **{"sandbox.allowed_binds": [str(shared)]})
    [problem] = submitted(paths, "harness", harness).rejected
    assert "/root" in problem.reason and "read-write" in problem.reason, problem.reason
    # Read-only inside an allowed directory: fine; read-write there (only read-only allowed): refused.
    ok = {**harness, "harness": {"command": "true", "binds": [f"{shared}:/shared:ro"]}}
    assert submitted(paths, "harness", ok).jobs == 1
    rw = {**harness, "harness": {"command": "true", "binds": [f"{shared}:/shared:rw"]}}
    [problem] = submitted(paths, "harness", rw).rejected
    assert "read-write" in problem.reason and "sandbox.allowed_rw_binds" in problem.reason, problem.reason
    # The job's own directory is its workspace: binding it read-write needs no permission.
    policy = SandboxPolicy.of_settings()
    job_dir = paths.job_dir("j-1")
    job_dir.mkdir(parents=True)
    decided = policy.decide({}, {"binds": [f"{job_dir}:/out:rw"], "workspace": str(job_dir)}, handler="code",
                            job_dir=job_dir)
    assert decided["binds"][0]["read_only"] is False
    with pytest.raises(SandboxPolicyError, match="workspace"):
        policy.decide({}, {"workspace": str(shared)}, handler="code", job_dir=job_dir)


@needs_bwrap
def test_every_sandbox_a_handler_opens_goes_through_the_policy(tmp_path: Path) -> None:
    """A handler of a user's package that passes a row's wishes straight on is held too."""
    paths = SpoolPaths.of(tmp_path / "run")
    job = JobSpec(job_id="p-0000001-0000", group_id="p-0000001", instance_id="p", sample_index=0,
                  handler="mine", instance={})
    services = WorkerServices(paths=paths, worker_id="w", node=current_node(), runtime="bwrap")
    ctx = JobContext(job=job, stage=Stage.INIT, attempt=1, services=services)
    for wish in ({"image": "/"}, {"binds": ["/root:/hostroot:rw"]}, {"network": True},
                 {"limits": {"total_memory_mb": 1 << 20}}, {"fakeroot": True}):
        with pytest.raises(SandboxPolicyError):
            asyncio.run(ctx.open_sandbox(**wish))
    assert "sandbox" not in ctx.state


# -- the network ----------------------------------------------------------------------------
@pytest.fixture
def host_port() -> Iterator[int]:
    """A TCP port on the host's loopback that answers `hello` (what a sandbox must not reach)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def reach(port: int) -> dict[str, Any]:
    probe = (f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), 3); "
             f"print('reached', s.recv(10).decode().strip())\"")
    return {"commands": [probe], "expect": "reached hello", "network": True}


@needs_bwrap
def test_network_is_denied_unless_the_operator_allows_it(tmp_path: Path, host_port: int) -> None:
    closed = make_run(tmp_path / "closed", **{"sandbox.runtime": "bwrap"})
    [problem] = submitted(closed, "shell", reach(host_port)).rejected
    assert "network" in problem.reason and "sandbox.network_handlers" in problem.reason, problem.reason
    plant(closed, "shell", reach(host_port))
    drain_with_a_worker(closed)
    row = only_row(closed)
    assert row["status"] == "failed" and "SandboxPolicyError" in row["error"] and "network" in row["error"], row

    opened = make_run(tmp_path / "open", **{"sandbox.runtime": "bwrap", "sandbox.network_handlers": ["shell"]})
    assert submitted(opened, "shell", reach(host_port)).jobs == 1
    drain_with_a_worker(opened)
    row = only_row(opened)
    assert row["status"] == "ok" and row["reward"] == 1.0, row

"""Ownership (issue 22, item 2): a run is created with explicit modes whatever the umask (owner
only, or readable by one group), and its workers act only on tickets and batch files owned by the
run's owner, root or a trusted user: a file planted by anyone else is quarantined with a reason
and an event, never run. The second user is a real one, created here (CI runs as root)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.config import RunConfig
from orchestrator.spool.access import AccessError, Owners
from orchestrator.spool.jobs import JobSpec
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.tickets import Ticket
from orchestrator.submission.submit import stage_and_publish, submit_rows
from tests.core.util import drain_with_a_worker, make_run, refusal_as, rows

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating a second user and group needs root (CI runs as root)")


@pytest.fixture
def stranger() -> Iterator[pwd.struct_passwd]:
    """A real second user of this host, removed afterwards."""
    name = f"hpcr{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def group() -> Iterator[grp.struct_group]:
    """A real group for a shared run, removed afterwards."""
    name = f"hpcrg{secrets.token_hex(3)}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield grp.getgrnam(name)
    finally:
        subprocess.run(["groupdel", name], check=False, capture_output=True)


def planted(paths: SpoolPaths, owner: pwd.struct_passwd, submission: str, jobs: int) -> list[str]:
    """`jobs` tickets of the `echo` handler queued as one entry (a batch when jobs > 1) that
    `owner` wrote: the queue file is theirs."""
    tickets = [Ticket(job=JobSpec(job_id=f"{submission}-0000000-{i:04d}", group_id=f"{submission}-0000000",
                                  instance_id="planted", sample_index=i, handler="echo", instance={"planted": True},
                                  submission_id=submission, submitted_at=time.time()), enqueued_at=time.time())
               for i in range(jobs)]
    before = set(os.listdir(paths.init_queue))
    names, _ = stage_and_publish(paths, submission, tickets, batch_size=jobs)
    [entry] = set(os.listdir(paths.init_queue)) - before
    os.chown(paths.init_queue / entry, owner.pw_uid, owner.pw_gid)
    return names


def events(paths: SpoolPaths) -> list[dict[str, Any]]:
    return [json.loads(line) for f in paths.events.glob("*.jsonl") for line in f.read_text().splitlines() if line]


@needs_root
def test_tickets_and_batches_of_another_user_are_quarantined_not_run(tmp_path: Path,
                                                                     stranger: pwd.struct_passwd) -> None:
    paths = make_run(tmp_path / "run")
    mine = submit_rows(paths, [(1, {"handler": "echo", "instance": {"mine": True}})])
    single = planted(paths, stranger, "20250101T000000000-aaaa", 1)
    batch = planted(paths, stranger, "20250101T000000000-bbbb", 3)
    # A claim directory without a heartbeat holding a stranger's ticket: recovery must not requeue it as ours.
    ghost = paths.claims("ghost-worker")
    ghost.mkdir()
    [ghost_job] = planted(paths, stranger, "20250101T000000000-cccc", 1)
    os.rename(paths.init_queue / ghost_job, ghost / ghost_job)

    drain_with_a_worker(paths)

    assert [r["job_id"] for r in rows(paths)] == [mine.first_job], "only the owner's job may run"
    reasons = {p.name: p.read_text() for p in paths.quarantine.glob("*.reason")}
    assert len(reasons) == 3, reasons
    for text in reasons.values():
        assert f"uid {stranger.pw_uid} ({stranger.pw_name})" in text and "[access] trusted" in text, text
    kept = sorted(p.name.rsplit(".", 1)[0] for p in paths.quarantine.iterdir() if not p.name.endswith(".reason"))
    assert kept == sorted([single[0], f"{batch[0]}+3", ghost_job]), kept
    noted = [e for e in events(paths) if e["event"] == "quarantined"]
    assert {e["job"] for e in noted} == {single[0], f"{batch[0]}+3", ghost_job}, noted
    assert all(stranger.pw_name in e["reason"] for e in noted)


@needs_root
def test_a_trusted_users_tickets_are_run(tmp_path: Path, stranger: pwd.struct_passwd) -> None:
    paths = make_run(tmp_path / "run", **{"access.trusted": [stranger.pw_name]})
    jobs = planted(paths, stranger, "20250101T000000000-dddd", 2)
    drain_with_a_worker(paths)
    assert sorted(r["job_id"] for r in rows(paths)) == jobs
    assert [r["status"] for r in rows(paths)] == ["ok", "ok"]
    assert not list(paths.quarantine.iterdir())


@needs_root
def test_a_worker_of_an_untrusted_user_refuses_to_start(tmp_path: Path, stranger: pwd.struct_passwd) -> None:
    """What it wrote (tickets it moves on) the owner's workers would quarantine: it says so and stops."""
    paths = make_run(tmp_path / "run")
    owners = Owners.of(paths, RunConfig.load(paths.run_config).access)
    assert owners.owner == os.getuid()
    owners.check_self(paths)   # the owner's own worker starts
    message = refusal_as(stranger, lambda: owners.check_self(paths), AccessError)
    assert message is not None, "the stranger's worker would have started"
    assert f"this worker runs as uid {stranger.pw_uid} ({stranger.pw_name})" in message and "[access] trusted" in message
    trusting = Owners.of(paths, RunConfig().with_overrides({"access.trusted": [str(stranger.pw_uid)]}).access)
    assert stranger.pw_uid in trusting.trusted


# -- modes ------------------------------------------------------------------------------------
CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def as_user_with_umask(umask: int, *args: str, timeout: float = 240) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, preexec_fn=lambda: os.umask(umask))
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def run_everything(run: Path, umask: int, tmp_path: Path, settings: list[str]) -> None:
    """init, submit, a backend added through the Python API (a trainer's process keeps its umask),
    a local worker until drained, status, report, cancel: each as its own process with `umask`."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"handler": "echo", "instance": {"n": n}}) + "\n" for n in range(12)))
    as_user_with_umask(umask, *CLI, "init", str(run), "--set", "shards.idle_flush_s=0.1", "--set", "jobs.batch_size=4",
                       *settings)
    as_user_with_umask(umask, *CLI, "submit", str(run), str(tasks))
    as_user_with_umask(umask, sys.executable, "-c", "import sys; from orchestrator.trainer.api import Spool; "
                       "from orchestrator.llm.registry import BackendRegistry; spool = Spool.open(sys.argv[1]); "
                       "BackendRegistry.of(spool.paths).add('http://127.0.0.1:9/v1', version=1); "
                       "spool.submit([{'n': 99}], handler='echo')", str(run))
    as_user_with_umask(umask, *CLI, "launch", str(run), "--local", "--workers", "1", "--wait")
    as_user_with_umask(umask, *CLI, "status", str(run))
    as_user_with_umask(umask, *CLI, "report", str(run))
    as_user_with_umask(umask, *CLI, "cancel", str(run), "--all")


def spool_entries(run: Path) -> Iterator[tuple[Path, os.stat_result]]:
    yield run, os.lstat(run)
    for directory, subdirs, files in os.walk(run):
        for name in subdirs + files:
            path = Path(directory) / name
            yield path, os.lstat(path)


@pytest.mark.parametrize("umask", [0o002, 0o022], ids=["umask002", "umask022"])
def test_every_spool_file_is_owner_only_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    run = tmp_path / "run"
    run_everything(run, umask, tmp_path, [])
    seen = {"file": 0, "dir": 0, "shard": 0}
    for path, st in spool_entries(run):
        if stat.S_ISLNK(st.st_mode):
            continue   # logs/latest: a link's own mode means nothing
        assert st.st_mode & 0o077 == 0, f"{path} is {stat.filemode(st.st_mode)} under umask {umask:03o}"
        seen["dir" if stat.S_ISDIR(st.st_mode) else "file"] += 1
        seen["shard"] += path.suffix == ".parquet"
    assert seen["shard"] and seen["file"] > 20 and seen["dir"] > 10, seen   # it really ran: shards, report, events


@needs_root
def test_a_group_run_is_readable_by_its_group_and_writable_by_nobody_else(tmp_path: Path,
                                                                          group: grp.struct_group) -> None:
    run = tmp_path / "run"
    run_everything(run, 0o002, tmp_path, ["--set", f"access.group={group.gr_name}"])
    shards = 0
    for path, st in spool_entries(run):
        if stat.S_ISLNK(st.st_mode):
            continue
        shown = f"{path} is {stat.filemode(st.st_mode)}"
        if stat.S_ISDIR(st.st_mode):
            assert stat.S_IMODE(st.st_mode) == 0o2750 and st.st_gid == group.gr_gid, shown
        else:
            assert st.st_mode & 0o137 == 0 and st.st_mode & 0o040 and st.st_gid == group.gr_gid, shown
            shards += path.suffix == ".parquet"
    assert shards


@needs_root
def test_a_registry_written_by_another_user_is_quarantined_and_jobs_wait_for_a_new_one(
        tmp_path: Path, stranger: pwd.struct_passwd) -> None:
    pytest.importorskip("torch")   # the chat handler's tokenizer is the tiny model's
    from tests.core.util import cli, start_worker, stop_worker, wait_drained, wait_until
    from tests.faults.fake_vllm import FakeVLLM
    from tests.faults.helpers import chat_task, register, tiny_tokenizer

    paths = make_run(tmp_path / "run")
    with FakeVLLM() as server, FakeVLLM() as impostor:
        register(paths, impostor.url)                 # the stranger's registry sends every task to their server
        os.chown(paths.backends, stranger.pw_uid, stranger.pw_gid)
        submit_rows(paths, [(n, chat_task(n)) for n in range(2)])
        worker = start_worker(paths)
        try:
            wait_until(lambda: any(paths.quarantine.glob("backends.json.*.reason")), 60, "the registry quarantined")
            assert rows(paths) == []
            cli("backend", "add", str(paths.root), server.url, "--model", "fake", "--tokenizer", str(tiny_tokenizer()))
            wait_drained(paths, timeout=120)
        finally:
            assert stop_worker(worker) == 0
    got = rows(paths)
    assert [r["status"] for r in got] == ["ok", "ok"], [r["error"] for r in got]
    assert {t["backend"] for r in got for t in r["turns"]} == {server.url}, "a turn went to the stranger's server"
    [note] = paths.quarantine.glob("backends.json.*.reason")
    assert f"uid {stranger.pw_uid} ({stranger.pw_name})" in note.read_text()
    assert any(e["event"] == "registry_quarantined" for e in events(paths))

"""Whatever a queue holds, a worker stays answerable and runs only what the run's owner wrote
(issue 34, items 2 and 3).

A group member who can write into a queue directory (a run opened by hand, an old run made with
umask 002) plants, under a job's name: a FIFO (an `open()` that never returns), a symbolic link
to /dev/zero (a `read()` that never ends), a link to another run's ticket, a hard link to a file
of the owner's, or rewrites a group-writable ticket in place. Each is moved to quarantine/ with a
reason, unread; every job the owner submitted ends ok; and the worker still leaves within its
grace on SIGTERM.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

from orchestrator.spool import access
from orchestrator.spool.jobs import JobSpec
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.tickets import Ticket
from orchestrator.submission.submit import submit_rows
from tests.core.util import FAST, cli, drain_with_a_worker, make_run, refusal_as, rows, start_worker, wait_drained

PLANTED = "00000000T000000000-dead-0000000-0000"   # sorts before every real submission
GRACE_S = FAST["shutdown.grace_s"]


def planted_ticket(job_id: str = PLANTED) -> bytes:
    return Ticket(job=JobSpec(job_id=job_id, group_id=job_id.rsplit("-", 1)[0], instance_id="planted",
                              sample_index=0, handler="echo", instance={"planted": True}),
                  enqueued_at=time.time()).encode()


def fifo(paths: SpoolPaths, tmp_path: Path) -> str:
    os.mkfifo(paths.init_queue / PLANTED)
    return "not a regular file"


def link_to_dev_zero(paths: SpoolPaths, tmp_path: Path) -> str:
    os.symlink("/dev/zero", paths.init_queue / PLANTED)
    return "symbolic link"


def link_to_another_runs_ticket(paths: SpoolPaths, tmp_path: Path) -> str:
    other = make_run(tmp_path / "other-run")
    report = submit_rows(other, [(1, {"handler": "echo", "instance": {"other_run": True}})])
    os.symlink(other.init_queue / report.first_job, paths.init_queue / report.first_job)
    return "symbolic link"


def hard_link_to_an_owners_file(paths: SpoolPaths, tmp_path: Path) -> str:
    elsewhere = tmp_path / "elsewhere.json"   # the owner's, mode 0600: only its second name is planted
    elsewhere.write_bytes(planted_ticket())
    os.chmod(elsewhere, 0o600)
    os.link(elsewhere, paths.init_queue / PLANTED)
    return "2 links"


def rewritten_group_writable_ticket(paths: SpoolPaths, tmp_path: Path) -> str:
    """A ticket as an umask-002 run left it (0660 in a 0770 queue), rewritten in place by a member:
    the file keeps its owner, so only its mode says someone else could have written it."""
    report = submit_rows(paths, [(1, {"handler": "echo", "instance": {"queued_by": "owner"}})],
                         source="owner.jsonl")
    ticket = paths.init_queue / report.first_job
    os.chmod(ticket, 0o660)
    with open(ticket, "r+b") as handle:   # in place: same inode, same owner
        content = handle.read().replace(b'"queued_by":"owner"', b'"queued_by":"member"')
        handle.seek(0)
        handle.write(content)
        handle.truncate()
    return "writable by its group"


ATTACKS: dict[str, Callable[[SpoolPaths, Path], str]] = {
    "fifo": fifo, "dev_zero_link": link_to_dev_zero, "other_runs_ticket": link_to_another_runs_ticket,
    "hard_link": hard_link_to_an_owners_file, "group_writable": rewritten_group_writable_ticket,
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_planted_queue_entry_is_quarantined_unread_and_the_worker_stays_answerable(
        tmp_path: Path, attack: str) -> None:
    paths = make_run(tmp_path / "run")
    mine = submit_rows(paths, [(n, {"handler": "echo", "instance": {"n": n}}) for n in range(4)])
    expected_reason = ATTACKS[attack](paths, tmp_path)
    planted_names = {name for name in os.listdir(paths.init_queue) if name.startswith(PLANTED)} | (
        {n for n in os.listdir(paths.init_queue) if os.path.islink(paths.init_queue / n)})
    worker = start_worker(paths)
    try:
        wait_drained(paths, timeout=60)
        time.sleep(0.5)   # the last shard is committed
        signalled = time.monotonic()
        os.killpg(worker.pid, signal.SIGTERM)
        code = worker.wait(timeout=GRACE_S + 10)
        took = time.monotonic() - signalled
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    assert code == 0 and took < GRACE_S + 5, (code, took)

    done = {row["job_id"]: row for row in rows(paths)}
    submission = mine.first_job.rsplit("-", 2)[0]
    owners_jobs = [f"{submission}-{n:07d}-0000" for n in range(4)]
    assert all(done.get(job, {}).get("status") == "ok" for job in owners_jobs), done
    ran = set(done) - set(owners_jobs)
    if attack == "group_writable":   # the owner's ticket, rewritten: it must not run as written
        assert all(row["status"] != "ok" for job, row in done.items() if job in ran), ran
    else:
        assert not ran, f"a planted entry ran: {sorted(ran)}"

    reasons = {p.name: p.read_text() for p in paths.quarantine.glob("*.reason")}
    assert len(reasons) == 1 and expected_reason in next(iter(reasons.values())), reasons
    [kept] = [p for p in paths.quarantine.iterdir() if not p.name.endswith(".reason")]
    assert kept.name.rsplit(".", 1)[0] in planted_names or attack == "group_writable", kept
    if attack == "fifo":
        assert stat.S_ISFIFO(kept.lstat().st_mode)   # moved aside as it was, never opened for good
    if attack in ("dev_zero_link", "other_runs_ticket"):
        assert kept.is_symlink()                     # the link itself, its target untouched
    if attack == "other_runs_ticket":
        assert len(os.listdir(tmp_path / "other-run" / "queue" / "init")) == 1, "the other run keeps its ticket"


# -- directories others could drop or swap files in ---------------------------------------------
def modes(paths: SpoolPaths) -> dict[str, int]:
    return {p.relative_to(paths.root).as_posix() or ".": stat.S_IMODE(p.stat().st_mode)
            for p in (paths.root, paths.queue, paths.init_queue, paths.eval_queue, paths.active)}


def test_launch_closes_queue_directories_an_old_umask_left_open_and_says_so(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    for directory in (paths.root, paths.queue, paths.init_queue, paths.active):   # as umask 002 made them
        os.chmod(directory, 0o775)
    submit_rows(paths, [(1, {"handler": "echo", "instance": {}})])
    done = cli("launch", str(paths.root), "--local", "--workers", "1", "--wait")
    assert all(mode & 0o022 == 0 for mode in modes(paths).values()), modes(paths)
    for name in (str(paths.root), str(paths.init_queue), str(paths.active)):
        assert f"repaired {name}: mode 0775 -> 0755" in done.stderr, done.stderr
    assert [row["status"] for row in rows(paths)] == ["ok"]


def test_a_worker_started_by_hand_closes_them_too_with_an_event(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    os.chmod(paths.init_queue, 0o777)
    submit_rows(paths, [(1, {"handler": "echo", "instance": {}})])
    drain_with_a_worker(paths)
    assert modes(paths)["queue/init"] == 0o755
    repaired = [json.loads(line) for f in paths.events.glob("*.jsonl") for line in f.read_text().splitlines()
                if '"access_repaired"' in line]
    assert len(repaired) == 1 and "queue/init: mode 0777 -> 0755" in repaired[0]["reason"], repaired


def test_a_sticky_queue_opened_to_trusted_users_is_left_open(tmp_path: Path) -> None:
    """`chmod g+wt queue/init`: members may add files (their own, owner-checked), never move or
    remove the owner's, so nothing of the owner's can be swapped there."""
    paths = make_run(tmp_path / "run")
    os.chmod(paths.init_queue, 0o1770)
    submit_rows(paths, [(1, {"handler": "echo", "instance": {}})])
    drain_with_a_worker(paths)
    assert modes(paths)["queue/init"] == 0o1770
    assert [row["status"] for row in rows(paths)] == ["ok"]


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second user needs root (CI runs as root)")
def test_a_user_who_cannot_close_a_loose_directory_is_told_the_fix(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="loose-"))   # pytest's own directories are root's alone
    os.chmod(base, 0o755)
    paths = make_run(base / "run")
    for directory in (paths.root, paths.queue):
        os.chmod(directory, 0o755)
    os.chmod(paths.init_queue, 0o777)
    nobody = pwd.getpwnam("nobody")
    message = refusal_as(nobody, lambda: access.tighten([paths.init_queue]), access.AccessError)   # not its owner
    assert message is not None, "tighten did not refuse"
    shutil.rmtree(base)
    assert f"chmod go-w {paths.init_queue}" in message and "mode 0777" in message, message


def test_a_planted_link_in_place_of_a_jobs_directory_is_moved_aside_not_followed(tmp_path: Path) -> None:
    """jobs/XX/JOB linked elsewhere: a local-runtime worker would make the job's workspace inside
    the link's target, and remove it there afterwards."""
    paths = make_run(tmp_path / "run")
    report = submit_rows(paths, [(1, {"handler": "shell", "instance": {"commands": ["echo hi > out.txt"],
                                                                       "expect": ""}})])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("the target's own file\n")
    job_dir = paths.job_dir(report.first_job)
    job_dir.parent.mkdir(parents=True)
    os.symlink(elsewhere, job_dir)
    drain_with_a_worker(paths, "--runtime", "local")
    assert sorted(os.listdir(elsewhere)) == ["keep.txt"], "the worker made its workspace through the link"
    assert job_dir.is_dir() and not job_dir.is_symlink()
    [row] = rows(paths)
    assert row["status"] == "ok", row
    reasons = [p.read_text() for p in paths.quarantine.glob("*.reason")]
    assert len(reasons) == 1 and "symbolic link" in reasons[0], reasons

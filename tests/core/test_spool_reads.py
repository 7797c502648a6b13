"""Every spool file is opened one way: no link followed, no FIFO waited on, checked on the
descriptor, bounded (orchestrator/safe_open.py, through orchestrator/spool/fsops.py).

The convention test reads the package's source: a call that opens a file by its name (open(),
os.open, Path.read_bytes / read_text, Arrow's readers...) is allowed only in the modules listed
below, each with the reason it never opens a spool file that way. Anything else goes through
fsops (read_bytes, read_regular, open_regular, open_append; shards: spool/shard_reader.py).
"""

from __future__ import annotations

import ast
import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator.spool import fsops
from orchestrator.spool.shard_reader import open_shard

REPO = Path(__file__).resolve().parents[2]

# Calls that open a file by name: a builtin, os functions, Path methods, Arrow and parsers' readers.
OPENING_FUNCTIONS = {"open"}
OPENING_ATTRIBUTES = {
    "os": {"open", "fdopen"}, "pq": {"read_table", "ParquetFile", "read_metadata", "read_schema"},
    "pj": {"read_json"}, "ds": {"dataset"}, "pa": {"memory_map", "OSFile"}, "tomllib": {"load"},
    "json": {"load"}, "orjson": set(), "*": {"read_bytes", "read_text"},
}

THE_ONE_WAY = {"fsops", "safe_open"}

ALLOWED: dict[str, str] = {
    "orchestrator/safe_open.py": "the one opening of files someone else may have planted",
    "orchestrator/spool/fsops.py": "creates files exclusively (O_EXCL), appends O_NOFOLLOW, opens directories",
    "orchestrator/spool/shards.py": "creates a new shard exclusively (O_EXCL) to write it",
    "orchestrator/spool/journal.py": "creates a new journal file exclusively (O_EXCL) to append to it",
    "orchestrator/spool/events.py": "wraps descriptors fsops opened (open_append, open_regular)",
    "orchestrator/report/event_read.py": "wraps descriptors fsops opened (open_regular)",
    "orchestrator/llm/history.py": "wraps a descriptor fsops opened (open_append)",
    "orchestrator/spool/shard_reader.py": "decodes the mapping of a file fsops opened",
    "orchestrator/app/local_launch.py": "a worker's log, in the launch directory its launcher has just created",
    "orchestrator/cli/console.py": "the terminal",
    "orchestrator/cli/core.py": "the user's cursor file, named on the command line",
    "orchestrator/cli/sbatch.py": "the output file named on the command line",
    "orchestrator/cli/tasks.py": "the user's task file, named on the command line",
    "orchestrator/submission/submit.py": "the user's task and sampling files, named on the command line",
    "orchestrator/grading/code_runner.py": "runs inside the sandbox, on the sandbox's own files",
    "orchestrator/grading/scorer_runner.py": "runs inside the sandbox, on the sandbox's own files",
    "orchestrator/grading/verl_reward.py": "the operator's reward file (run.toml [rewards] verl_custom_path)",
    "orchestrator/doctor/probes.py": "measures the filesystem itself, below what fsops works around",
    "orchestrator/trainer/verl/warm_up.py": "verl's dataset files (data.train_files: the user's)",
    "orchestrator/doctor/run.py": "the doctor's Slurm job output, in logs/",
    "orchestrator/doctor/report.py": "/proc/self/mounts",
    "orchestrator/llm/identity.py": "a model directory (the operator's)",
    "orchestrator/proxy/relay.py": "the proxy's runtime directory (0700, created by the worker)",
    "orchestrator/proxy/server.py": "the proxy's runtime directory (0700, created by the worker), its own source",
    "orchestrator/report/page.py": "a package resource",
    "orchestrator/slurm/templates.py": "a package resource",
    "orchestrator/sandbox/images/templates.py": "a package resource",
    "orchestrator/sandbox/images/builder.py": "an image template's lock file (the operator's)",
    "orchestrator/sandbox/images/cache.py": "image template files (the operator's)",
    "orchestrator/sandbox/base.py": "a host file a handler uploads into its sandbox",
    "orchestrator/sandbox/launch.py": "the sandbox's runtime directory (checked by records.py), its server log",
    "orchestrator/sandbox/process.py": "the sandbox's runtime directory (checked by records.py)",
    "orchestrator/sandbox/records.py": "the user's runtime directory, owner and mode checked first",
    "orchestrator/process_start.py": "/proc",
    "orchestrator/sandbox/cgroups.py": "/sys/fs/cgroup",
    "orchestrator/sandbox/workspace.py": "copies a workspace out with O_NOFOLLOW | O_NONBLOCK itself",
    "handlers/bundled/image.py": "an image template (a package resource)",
    "handlers/bundled/write.py": "files of a bundled image being written",
    "handlers/reasoning_gym_task.py": "its scorer's source, a file of the package, sent to the scorer sandbox",
    "handlers/verifiers_task.py": "verifiers_rollout.py, a file of the package, sent to the job's sandbox",
    "handlers/verifiers_rollout.py": "runs inside the sandbox, on the sandbox's own files",
}
SKIPPED_PACKAGES = ("orchestrator/sandbox/server/", "orchestrator/devserver/")   # run in sandboxes / serve models


def opening_calls(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name) and function.id in OPENING_FUNCTIONS:
            found.append((node.lineno, function.id))
        elif isinstance(function, ast.Attribute):
            base = function.value.id if isinstance(function.value, ast.Name) else "*"
            if base in THE_ONE_WAY:
                continue
            if function.attr in OPENING_ATTRIBUTES.get(base, set()) | OPENING_ATTRIBUTES["*"]:
                found.append((node.lineno, f"{ast.unparse(function.value)}.{function.attr}"))
    return sorted(found)


def test_nothing_but_fsops_opens_spool_files() -> None:
    offenders = []
    for folder in ("orchestrator", "handlers"):
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative in ALLOWED or relative.startswith(SKIPPED_PACKAGES):
                continue
            offenders += [f"{relative}:{line}: {call}" for line, call in opening_calls(ast.parse(path.read_text()))]
    assert not offenders, ("files opened by name outside fsops (read spool files with fsops.read_bytes / "
                           "open_regular, shards with spool/shard_reader.py; or list the module in ALLOWED with "
                           "the reason it never opens a spool file):\n  " + "\n  ".join(offenders))


def test_the_checker_sees_each_kind_of_opening() -> None:
    source = "open(p)\nos.open(p, 0)\np.read_bytes()\nq.read_text()\npq.read_table(p)\nds.dataset(p)\nfsops.read_bytes(p)\n"
    assert [call for _, call in opening_calls(ast.parse(source))] == [
        "open", "os.open", "p.read_bytes", "q.read_text", "pq.read_table", "ds.dataset"]


def test_every_allowed_module_exists() -> None:
    assert [m for m in ALLOWED if not (REPO / m).is_file()] == []


@pytest.mark.parametrize("kind", ["fifo", "link_to_dev_zero", "link_to_a_file", "directory", "over_the_limit"])
def test_a_spool_read_refuses_at_once_what_is_no_regular_file_or_too_large(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ticket"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "link_to_a_file":
        (tmp_path / "target").write_bytes(b"{}")
        os.symlink(tmp_path / "target", path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 101)
    started = time.monotonic()
    with pytest.raises(fsops.UnsafeSpoolFile) as refused:
        fsops.read_bytes(path, limit=100)
    assert time.monotonic() - started < 1.0
    expected = {"fifo": "is a FIFO", "link_to_dev_zero": "symbolic link", "link_to_a_file": "symbolic link",
                "directory": "is a directory", "over_the_limit": "more than the 100"}[kind]
    assert expected in str(refused.value), refused.value
    assert isinstance(refused.value, OSError)   # callers that survive I/O errors survive this too


def test_a_file_at_its_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "ticket"
    path.write_bytes(b"y" * 100)
    assert fsops.read_bytes(path, limit=100) == b"y" * 100


def test_appending_never_writes_through_a_planted_link_or_waits_on_a_fifo(tmp_path: Path) -> None:
    target = tmp_path / "host-file"
    target.write_bytes(b"precious\n")
    os.symlink(target, tmp_path / "events.jsonl")
    with pytest.raises(fsops.UnsafeSpoolFile, match="symbolic link"):
        fsops.open_append(tmp_path / "events.jsonl")
    assert target.read_bytes() == b"precious\n"
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(fsops.UnsafeSpoolFile, match="FIFO"):
        fsops.open_append(tmp_path / "fifo.jsonl")


def test_a_planted_shard_is_refused_without_waiting(tmp_path: Path) -> None:
    """pyarrow would open a FIFO by its name and wait for a writer; a read on another thread
    that never returns is what the test would see then."""
    os.mkfifo(tmp_path / "w-000001.parquet")
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            open_shard(tmp_path / "w-000001.parquet")
        except BaseException as exc:   # noqa: BLE001 - the outcome is what is asserted
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():   # free the stuck thread before failing
        fd = os.open(tmp_path / "w-000001.parquet", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("opening a planted FIFO as a shard blocked")
    assert len(outcome) == 1 and isinstance(outcome[0], fsops.UnsafeSpoolFile), outcome

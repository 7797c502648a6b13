"""One source of settings: RunConfig's defaults are the only defaults, RunConfig.load is the one
loader of run.toml with one behaviour when it is missing, and the job-id and shard-name formats
are each written and read in one module."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from orchestrator.config import RunConfig
from orchestrator.config import ConfigError
from orchestrator.llm.router import router_for, run_lease_s
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import open_run
from orchestrator.submission.submit import SubmitError, submit_rows
from tests.core.util import make_run

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "orchestrator"
IN_SANDBOX = PACKAGE / "sandbox" / "server"   # runs inside the sandbox: never imports the host package


def modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if IN_SANDBOX not in path.parents:
            yield path, ast.parse(path.read_text(), filename=str(path))


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)[:120]}"


# -- RunConfig's defaults are the only defaults ------------------------------------------------

def knob_defaults() -> dict[str, Any]:
    """Every numeric or boolean knob of run.toml by its key name (`lease_s`), with its default."""
    config = RunConfig()
    knobs: dict[str, Any] = {}
    for section in fields(config):
        value = getattr(config, section.name)
        if not hasattr(value, "__dataclass_fields__"):
            continue
        for knob in fields(value):
            default = getattr(value, knob.name)
            if isinstance(default, (int, float, bool)):
                knobs[knob.name] = default
    return knobs


def repeated_defaults(path: Path, tree: ast.Module, knobs: dict[str, Any]) -> list[str]:
    """Constants `DEFAULT_<KNOB> = v`, fields `<knob>: T = v` and parameters `<knob>=v` where v is
    a literal equal to that knob's default in RunConfig: a second copy that can drift."""
    def same(name: str, value: ast.AST | None) -> bool:
        key = name.lower().removeprefix("default_")
        return (key in knobs and isinstance(value, ast.Constant) and type(value.value) is type(knobs[key])
                and value.value == knobs[key])

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            found += [where(path, node) for t in node.targets if isinstance(t, ast.Name) and same(t.id, node.value)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and same(node.target.id, node.value):
            found.append(where(path, node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            positional = node.args.posonlyargs + node.args.args
            pairs: list[tuple[ast.arg, ast.expr | None]] = list(
                zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults))
            pairs += list(zip(node.args.kwonlyargs, node.args.kw_defaults))
            found += [f"{where(path, node.args)} in {node.name}()" for arg, default in pairs if same(arg.arg, default)]
    return found


def test_no_default_of_run_toml_is_repeated_outside_config() -> None:
    knobs = knob_defaults()
    assert {"lease_s", "view_s", "batch_size", "probe_after_s", "total_memory_mb"} <= set(knobs)
    found = [hit for path, tree in modules() if path != PACKAGE / "config.py"
             for hit in repeated_defaults(path, tree, knobs)]
    assert found == [], "use orchestrator.config.DEFAULTS (or the run's RunConfig) instead:\n" + "\n".join(found)


def test_the_check_finds_a_repeated_default() -> None:
    tree = ast.parse("DEFAULT_LEASE_S = 30.0\nclass R:\n    view_s: float = 1.0\n"
                     "def f(batch_size: int = 8, lease_s: float = 5.0) -> None: ...\n")
    assert len(repeated_defaults(PACKAGE / "x.py", tree, knob_defaults())) == 3


# -- one loader, one behaviour for a missing run.toml ---------------------------------------

def not_a_run_directory(root: Path) -> str:
    return f"{root} is not a run directory (no run.toml): create it with `hpc-rollout init {root}`"


LOADERS: dict[str, Callable[[Path], Any]] = {
    "RunConfig.load": lambda root: RunConfig.load(root / "run.toml"),
    "open_run": open_run,
    "router_for": lambda root: router_for(SpoolPaths.of(root), "w-bare"),
    "run_lease_s": lambda root: run_lease_s(SpoolPaths.of(root)),
}


@pytest.mark.parametrize("loader", LOADERS)
def test_a_directory_without_run_toml_is_refused_alike_everywhere(loader: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        LOADERS[loader](tmp_path)
    assert str(refused.value) == not_a_run_directory(tmp_path)


def test_submit_and_a_worker_refuse_it_with_the_same_words(tmp_path: Path) -> None:
    with pytest.raises(SubmitError) as refused:
        submit_rows(SpoolPaths.of(tmp_path), iter([]), "tasks.jsonl", handler="echo")
    assert str(refused.value) == not_a_run_directory(tmp_path)
    worker = subprocess.run([sys.executable, "-m", "orchestrator.worker", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert worker.returncode != 0 and not_a_run_directory(tmp_path) in worker.stderr, worker.stderr
    assert "Traceback" not in worker.stderr, worker.stderr
    assert not (tmp_path / "run.toml").exists()


def test_swapping_weights_refuses_a_broken_run_toml_instead_of_ignoring_its_lag(tmp_path: Path) -> None:
    from orchestrator.cli.llm import reload_and_swap

    paths = make_run(tmp_path / "run")
    paths.run_config.write_text("[trainer]\nmax_policy_lag = 'two'\n")
    with pytest.raises(ConfigError, match="max_policy_lag"):
        reload_and_swap(paths.root, tmp_path / "no-checkpoint", version=None, max_policy_lag=None)


# Who may touch run.toml's path at all: the loader, run directory creation, the path itself, and
# `init` printing where the settings are.
RUN_TOML_USERS = {"orchestrator/spool/rundir.py", "orchestrator/spool/paths.py", "orchestrator/cli/core.py"}


def _names(node: ast.expr) -> set[str]:
    """The class names an except clause catches (run.toml's ConfigError, not e.g. SandboxConfigError)."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def test_run_toml_is_read_only_through_the_one_loader() -> None:
    found = []
    for path, tree in modules():
        loads = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
                 and ast.unparse(call.func) == "RunConfig.load"}
        rel = str(path.relative_to(REPO))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "run_config" and id(node) not in loads \
                    and rel not in RUN_TOML_USERS:
                found.append(where(path, node))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "RunConfig" and not node.args \
                    and not node.keywords and rel not in ("orchestrator/config.py", "orchestrator/spool/rundir.py"):
                found.append(where(path, node) + "  (defaults instead of the run's settings)")
            if isinstance(node, ast.ExceptHandler) and node.type is not None and "ConfigError" in _names(node.type) \
                    and not any(isinstance(inner, ast.Raise) for inner in ast.walk(node)):
                found.append(where(path, node.type) + "  (a ConfigError swallowed: a fallback to defaults)")
    assert found == [], "\n".join(found)


# -- the job-id format in one module ----------------------------------------------------------

JOB_IDS = PACKAGE / "spool" / "job_ids.py"


def job_id_formats(path: Path, tree: ast.Module) -> list[str]:
    """Writers of the format (`{index:07d}`, `{sample:04d}`), readers of it (a regex of 7 or 4 digits)
    and parsers of a submission's time stamp (strptime)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None \
                and ast.unparse(node.format_spec).strip("f'\"") in ("07d", "04d"):
            found.append(where(path, node))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and any(piece in node.value for piece in (r"\d{7}", r"\d{4}")):
            found.append(where(path, node))
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("strptime"):
            found.append(where(path, node))
    return found


def test_the_job_id_format_is_written_and_read_in_one_module() -> None:
    found = [hit for path, tree in modules() if path != JOB_IDS for hit in job_id_formats(path, tree)]
    assert found == [], "use orchestrator.spool.job_ids:\n" + "\n".join(found)
    assert job_id_formats(JOB_IDS, ast.parse(JOB_IDS.read_text()))   # the check sees the format where it is


def test_job_ids_round_trip_and_sort_in_submission_order() -> None:
    from orchestrator.spool.job_ids import (GroupId, JobId, group_id, group_of, job_id, new_submission_id, parse_group_id,
                                            parse_job_id, submitted_at)

    first, second = new_submission_id(), new_submission_id()
    assert job_id(first, 9, 3) < job_id(first, 10, 0) < job_id(second, 0, 0)
    assert parse_job_id(job_id(first, 12, 7)) == JobId(first, 12, 7)
    assert group_of(job_id(first, 12, 7)) == group_id(first, 12)
    assert parse_group_id(group_id(first, 12)) == GroupId(first, 12)
    assert parse_job_id("j1") is None and group_of("j1") is None and submitted_at("j1") == float("inf")
    assert abs(submitted_at(job_id(first, 0, 0)) - time_of(first)) < 0.002


def time_of(submission: str) -> float:
    import calendar
    import time

    return calendar.timegm(time.strptime(submission[:15], "%Y%m%dT%H%M%S")) + int(submission[15:18]) / 1000


# -- the shard-name filter in one module ---------------------------------------------------

SHARD_NAMES = PACKAGE / "spool" / "shardlog.py"


def shard_name_filters(path: Path, tree: ast.Module) -> list[str]:
    """`name.endswith(".parquet")`, `startswith(("_", "."))` or a `*.parquet` glob on shard names."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("endswith", "glob", "rglob", "fnmatch") \
                and any(isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.endswith(".parquet")
                        for arg in node.args for c in ast.walk(arg)):
            found.append(where(path, node))
    return found


def test_committed_shards_are_told_apart_in_one_module() -> None:
    found = [hit for path, tree in modules() if path != SHARD_NAMES for hit in shard_name_filters(path, tree)]
    assert found == [], "use orchestrator.spool.shards.shard_names / shardlog.parse_shard_name:\n" + "\n".join(found)
    sample = ast.parse("[n for n in names if n.endswith('.parquet')]\nlist(d.glob('*.parquet'))\n")
    assert len(shard_name_filters(PACKAGE / "x.py", sample)) == 2

"""`hpc-rollout` starts with what it needs (issue 39, item 9): the command table, every `--help`
and `status` of a new run load none of the heavy libraries; the commands that use them import
them when they run. Checked here by the modules a fresh interpreter holds, never by time
(`python -m benchmarks.cli_startup` times it, beside `python -c pass`).

A command module that needs one of HEAVY imports it inside its command function (or under
`if TYPE_CHECKING:` for annotations); the lower modules on the start-up path keep theirs lazy
the same way (slurm/launcher.py, slurm/templates.py, report/status.py, report/finished_values.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from orchestrator.report.finished import FINISHED_COLUMNS, finished_stats
from orchestrator.report.finished_values import FinishedStats
from orchestrator.spool.rows import SCHEMA
from tests.core.util import make_run

# Libraries (and asyncio, 30-40 ms of the standard library) that none of these may load. Each
# costs 50-450 ms to import; together they were most of the 1.2 s `hpc-rollout --help` took.
HEAVY = ("pyarrow", "numpy", "aiohttp", "httpx", "jinja2", "submitit", "torch", "transformers", "matplotlib",
         "asyncio")

# Prints, as JSON, the HEAVY modules loaded once the code given before it has run.
REPORT = f"\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"


def loaded_after(code: str) -> list[str]:
    """The HEAVY top-level modules a fresh interpreter holds after running `code`."""
    done = subprocess.run([sys.executable, "-c", code + REPORT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_command_line_loads_no_heavy_library() -> None:
    assert loaded_after("from orchestrator.cli import cli, main") == []


def test_every_help_text_is_built_without_a_heavy_library() -> None:
    code = ("import click\nfrom orchestrator.cli import cli\n"
            "def walk(command, name):\n"
            "    command.get_help(click.Context(command, info_name=name))\n"
            "    for sub, child in getattr(command, 'commands', {}).items():\n"
            "        walk(child, name + ' ' + sub)\n"
            "walk(cli, 'hpc-rollout')\n")
    assert loaded_after(code) == []


def test_version_and_help_run_without_a_heavy_library() -> None:
    for args in (["--version"], ["--help"], ["submit", "--help"]):
        code = f"from orchestrator.cli import cli\ncli.main({args!r}, prog_name='hpc-rollout', standalone_mode=False)\n"
        assert loaded_after(code) == [], args


@pytest.mark.parametrize("options", [[], ["--json"]], ids=["text", "json"])
def test_status_of_a_new_run_loads_no_heavy_library(tmp_path: Path, options: list[str]) -> None:
    # pyarrow and numpy load to read shards: a run with none yet (what `init` makes) needs neither.
    paths = make_run(tmp_path / "run")
    args = ["status", str(paths.root), *options]
    code = f"from orchestrator.cli import cli\ncli.main({args!r}, prog_name='hpc-rollout', standalone_mode=False)\n"
    assert loaded_after(code) == []


def test_the_check_sees_a_heavy_import() -> None:
    assert loaded_after("import orchestrator.report.finished") == ["numpy", "pyarrow"]


@pytest.mark.parametrize("pass_reward", [1.0, 0.5])
def test_a_run_without_shards_has_the_figures_of_no_rows(pass_reward: float) -> None:
    # What `status` says of a run with no shard (FinishedStats.of_no_rows, no pyarrow) is what
    # finished_stats computes from zero rows.
    empty = pa.table({name: pa.array([], type=SCHEMA.field(name).type) for name in FINISHED_COLUMNS})
    assert FinishedStats.of_no_rows(pass_reward) == finished_stats(empty, pass_reward)


def test_a_worker_starts_without_pandas_pyarrow_dataset_or_aiohttp() -> None:
    """Every worker process (a Slurm task, a local worker, thousands in the test suite) imports its
    engine: pyarrow.dataset pulls pandas in, ~0.5 s of CPU a start that no worker stage uses;
    aiohttp builds two TLS contexts as it is imported (0.1-0.3 s): loaded by the warm-up of a
    worker whose run has backends, or by its first request, not by a worker of sleep or shell jobs."""
    code = ("import json, sys\nimport orchestrator.worker.engine\n"
            "print(json.dumps(sorted(m for m in ('pandas', 'pyarrow.dataset', 'aiohttp') if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []

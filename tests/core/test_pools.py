"""Pools that can never finish a job are refused at `init` and `launch`, with the reason; with no
EVAL slot the command warns, naming what must also run (issue 22, item 8). Before, `launch --wait`
with pools of 0 never returned, and the log showed only the pool sizes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.config import RunConfig
from orchestrator.worker.options import WorkerOptions, parse_stages, pool_verdict
from tests.core.util import cli, make_run, write_jsonl

OK = {"handler": "sleep", "instance": {"run": 0.01}}


def launch(paths, *flags: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return cli("launch", str(paths.root), "--local", "--wait", *flags, check=False, timeout=60)


def test_launch_refuses_pools_that_never_finish_a_job(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [OK] * 3)))
    nothing = launch(paths, "--init-pool", "0", "--run-pool", "0", "--eval-pool", "0")
    assert nothing.returncode == 1 and "would claim nothing" in nothing.stderr, nothing.stderr
    assert "--init-pool" in nothing.stderr and "[pools]" in nothing.stderr
    never_run = launch(paths, "--run-pool", "0")
    assert never_run.returncode == 1 and "run = 0" in never_run.stderr, never_run.stderr
    never_prepared = launch(paths, "--init-pool", "0")
    assert never_prepared.returncode == 1 and "init = 0" in never_prepared.stderr, never_prepared.stderr
    assert not list(paths.logs.glob("*/worker-*.log")), "no worker was started"


def test_init_refuses_pools_of_zero_and_warns_when_nothing_evaluates(tmp_path: Path) -> None:
    refused = cli("init", str(tmp_path / "zero"), "--set", "pools.init=0", "--set", "pools.run=0",
                  "--set", "pools.eval=0", check=False)
    assert refused.returncode == 1 and "would claim nothing" in refused.stderr, refused.stderr
    assert not (tmp_path / "zero" / "run.toml").exists()
    warned = cli("init", str(tmp_path / "no-eval"), "--set", "pools.eval=0")
    assert "eval = 0" in warned.stderr and "--stages eval" in warned.stderr, warned.stderr


@pytest.mark.parametrize("stages,pools,refused,warned", [
    ("all", (4, 8, 4), None, None),
    ("eval", (0, 0, 2), None, None),                       # eval-only workers: fine
    ("all", (0, 0, 0), "would claim nothing", None),
    ("eval", (4, 8, 0), "would claim nothing", None),
    ("all", (4, 0, 4), "run = 0", None),
    ("all", (0, 8, 4), "init = 0", None),
    ("all", (4, 8, 0), None, "eval = 0"),
    ("init,run", (4, 8, 4), None, "--stages eval"),
    ("run,eval", (0, 8, 4), None, "INIT"),                 # RUN of what other workers on the node prepare
])
def test_pool_verdicts(stages: str, pools: tuple[int, int, int], refused: str | None, warned: str | None) -> None:
    options = WorkerOptions(stages=parse_stages(stages), init_pool=pools[0], run_pool=pools[1],
                            eval_pool=pools[2]).resolve(RunConfig())
    verdict = pool_verdict(options)
    assert (verdict.refusal is None) == (refused is None) and (refused or "") in (verdict.refusal or ""), verdict
    assert (verdict.warning is None) == (warned is None) and (warned or "") in (verdict.warning or ""), verdict

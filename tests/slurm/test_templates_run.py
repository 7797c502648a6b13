"""Rendered templates submitted by hand with sbatch on the real cluster, as a user would."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from orchestrator.slurm.templates import render
from tests.core.util import cli, wait_until
from tests.slurm.conftest import JobJanitor
from tests.slurm.util import events, exactly_once, queued, sleep_run, wait_rows

pytestmark = pytest.mark.slurm

SOURCE = Path(__file__).parents[2]
STUB = Path(__file__).parent / "stub_vllm"
HPC_ROLLOUT = f"{shlex.quote(sys.executable)} -c 'from orchestrator.cli import main; main()'"


def _sbatch(script: Path) -> str:
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    return out.stdout.strip().split(";")[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _backends(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "backends.json"
    return orjson.loads(path.read_bytes()).get("backends", []) if path.exists() else []


@pytest.mark.slurm(gpus_per_node=1)
def test_vllm_template_registers_its_node_and_deregisters_on_the_signal(
        tmp_path: Path, janitor: JobJanitor) -> None:
    run = sleep_run(tmp_path / "run", jobs=0, run_s=0)
    port = _free_port()
    script = tmp_path / "vllm.sbatch"
    script.write_text(render("vllm", {
        "run_dir": str(run.root), "model": "stub-model", "gpus": "1", "port": str(port), "time": "10",
        "python": shlex.quote(sys.executable), "hpc_rollout": HPC_ROLLOUT, "log_dir": str(tmp_path),
        "setup": [f"export PYTHONPATH={shlex.quote(str(STUB))}:{shlex.quote(str(SOURCE))}"],
    }))
    job = janitor.add(_sbatch(script))
    wait_until(lambda: bool(_backends(run.root)), 120, "the server to register")
    entry = _backends(run.root)[0]
    assert entry["url"] == f"http://{entry['node']}:{port}/v1"
    assert str(entry["node"]).startswith("node") and entry["protocol"] == "vllm"

    # The warning signal (preemption, time limit) reaches the batch shell: it deregisters, stops.
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, timeout=30)
    wait_until(lambda: not _backends(run.root), 60, "the server to deregister")
    wait_until(lambda: not queued(job), 60, "the job to end")
    log = next(tmp_path.glob("*.out")).read_text()
    assert "stub vllm serving stub-model" in log and "added http" in log and "removed http" in log


@pytest.mark.slurm(nodes=2)
def test_worker_template_processes_jobs_and_requeues_a_signalled_task(
        tmp_path: Path, janitor: JobJanitor) -> None:
    jobs = 120
    run = sleep_run(tmp_path / "run", jobs=jobs, run_s=1.0)
    script = tmp_path / "worker.sbatch"
    script.write_text(render("worker", {
        "run_dir": str(run.root), "nodes": "2", "time": "00:20:00", "python": shlex.quote(sys.executable),
        "run_pool": "2", "init_pool": "2", "eval_pool": "2",
        "setup": [f"export PYTHONPATH={shlex.quote(str(SOURCE))}"],
    }))
    array = janitor.add(_sbatch(script))
    wait_until(lambda: len(events(run, "finished")) >= 10, 120, "10 finished jobs")
    subprocess.run(["scancel", "--batch", "--signal=USR2", f"{array}_0"], check=True, timeout=30)
    wait_until(lambda: len(events(run, "worker_started")) >= 3, 120, "the signalled task to restart")
    wait_until(lambda: bool(events(run, "returned")), 60, "the signalled worker to return its claims")
    exactly_once(wait_rows(run, jobs), jobs)
    logs = "".join(p.read_text() for p in (run.root / "logs").glob("hpc-rollout-worker-*.out"))
    assert f"requeueing {array}_0" in logs and "restart 1" in logs
    cli("stop", str(run.root), "--cancel")   # finds the array through the workers' heartbeats
    assert queued(array) == []

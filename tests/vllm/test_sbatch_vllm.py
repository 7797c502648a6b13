"""`hpc-rollout sbatch render vllm` run against the real server: flags, env and readiness.

The rendered batch script is run with bash, as the batch step would run it (the #SBATCH
lines are comments to bash), with the settings a CPU site uses: its flags reach the stock
server, it registers only after one real token, and the warning signal deregisters it and
stops the server with all its processes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import sys
from pathlib import Path

import orjson
import pytest

from orchestrator.devserver.stock_vllm import CPU_ARGS, CPU_ENV, free_port, server_temp_directory
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.slurm.templates import render
from orchestrator.spool.rundir import init_run
from tests.core.util import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

SOURCE = Path(__file__).parents[2]
HPC_ROLLOUT = f"{shlex.quote(sys.executable)} -c 'from orchestrator.cli import main; main()'"


def registered(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "backends.json"
    return orjson.loads(path.read_bytes()).get("backends", []) if path.exists() else []


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_rendered_vllm_script_serves_registers_and_deregisters(tmp_path: Path, vllm_python: Path) -> None:
    paths, _ = init_run(tmp_path / "run")
    port = free_port()
    script = tmp_path / "vllm.sbatch"
    script.write_text(render("vllm", {
        "run_dir": str(paths.root), "model": str(tiny_model_dir().absolute()), "port": str(port),
        "gpus": "0", "python": shlex.quote(str(vllm_python)), "hpc_rollout": HPC_ROLLOUT,
        "log_dir": str(tmp_path), "health_timeout_s": "1200",
        "setup": [f"export {key}={value}" for key, value in CPU_ENV.items()]
                 + [f"export PYTHONPATH={shlex.quote(str(SOURCE))}"],
        "extra_args": shlex.join([*CPU_ARGS, "--max-model-len", "512"]),
    }))
    out = tmp_path / "job.out"
    # The node's temp directory: nothing of the job is left in it (short: a socket's path holds 107 bytes).
    job_tmp = Path(tempfile.mkdtemp(prefix="job-tmp."))
    with open(out, "wb") as log:
        batch = subprocess.Popen(["bash", str(script)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "SLURMD_NODENAME": "localhost", "TMPDIR": str(job_tmp)})
    try:
        wait_until(lambda: "registered http" in out.read_text(errors="replace") or batch.poll() is not None,
                   1500, "the server to register")
        text = out.read_text(errors="replace")
        assert batch.poll() is None, f"the batch script ended with {batch.returncode}:\n{text[-3000:]}"
        [entry] = registered(paths.root)
        assert entry["url"] == f"http://localhost:{port}/v1" and entry["protocol"] == "vllm"
        # Every flag reached the real server, and it was ready (one token) before registering.
        assert "non-default args" in text and "'enforce_eager': True" in text and "'max_model_len': 512" in text
        assert text.index("is serving: 1 token") < text.index("added http://localhost")
        # vLLM's engine sockets are in the server's own directory under TMPDIR
        [rpc_dir] = job_tmp.glob("vllm.*")
        assert any(p.is_socket() for p in rpc_dir.iterdir()), f"no vLLM socket in {rpc_dir}"

        batch.send_signal(signal.SIGUSR2)  # what `scancel --batch --signal=USR2` does
        assert batch.wait(120) == 143
        assert registered(paths.root) == []
        # vLLM's engine runs in child processes: stopping the server stopped them all.
        wait_until(lambda: not group_alive(batch.pid), 60, "every process of the server to exit")
    finally:
        if group_alive(batch.pid):
            os.killpg(batch.pid, signal.SIGKILL)
        batch.wait(30)
    assert "removed http://localhost" in out.read_text(errors="replace")
    # torch's compile cache (torchinductor_USER) is kept there on purpose: the next job reuses it
    left = sorted(f"{p.name}{' (socket)' if p.is_socket() else ''}" for p in job_tmp.iterdir()
                  if not p.name.startswith("torchinductor_"))
    shutil.rmtree(job_tmp)
    assert left == [], f"the job left these in the node's temp directory: {left}"


def test_the_socket_directory_falls_back_to_tmp_when_the_temp_directory_is_too_deep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 20)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    made = server_temp_directory()
    try:
        assert made.parent == Path("/tmp") and len(str(made)) + 37 <= 107
    finally:
        made.rmdir()
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    made = server_temp_directory()
    made.rmdir()
    assert made.parent == Path("/tmp")

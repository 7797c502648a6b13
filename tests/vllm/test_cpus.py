"""The stock vLLM leaves a CPU to its clients: its engine core busy-waits for the model worker,
and on a 2-vCPU machine a server free to use both starved the processes that talk to it (a test
polling /metrics, a stage worker) for a whole generation."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.devserver.cpus import parse_cpu_list, server_cpus
from orchestrator.sandbox.procs import live_members
from tests.vllm.conftest import VLLMServer


@pytest.mark.vllm
def test_every_process_of_the_server_runs_on_its_cpus_and_one_is_left_to_clients(vllm_server: VLLMServer) -> None:
    if vllm_server.pid is None:   # HPC_ROLLOUT_VLLM_URL, never set in CI: whoever started it chose its CPUs
        pytest.skip("a reused server (HPC_ROLLOUT_VLLM_URL): its processes are not this session's")
    members = live_members({vllm_server.pid})
    assert len(members) >= 3, f"api server, engine core and model worker expected, found {members}"
    usable = os.sched_getaffinity(0)
    for pid in members:
        assert os.sched_getaffinity(pid) == server_cpus(), f"pid {pid} runs on {os.sched_getaffinity(pid)}"
    if len(usable) > 1:
        assert usable - server_cpus(), "no CPU is left to the server's clients"


def test_a_cpu_list_is_read_like_taskset_s_and_a_wrong_one_is_refused_with_the_usable_ones() -> None:
    usable = sorted(os.sched_getaffinity(0))
    assert parse_cpu_list(f"{usable[0]}") == {usable[0]}
    assert parse_cpu_list(",".join(map(str, usable))) == set(usable)
    assert parse_cpu_list(f"{usable[-1]}-{usable[-1]}") == {usable[-1]}
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpu_list("zero")
    with pytest.raises(ValueError, match=r"not among this machine's usable ones"):
        parse_cpu_list("4096")
    # The command refuses it before it builds a model or installs anything.
    result = subprocess.run([sys.executable, "-m", "orchestrator.devserver.stock_vllm", "--tiny", "--cpus", "1-x"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--cpus" in result.stderr and "e.g. 0 or 0-3,6" in result.stderr, result.stderr

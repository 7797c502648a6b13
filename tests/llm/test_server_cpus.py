"""serve-llm can be confined to CPUs of its own (benchmarks.verl gives it all but the last, so
the model does not wait for a CPU behind the workers it serves): every thread it runs, the model
thread included, is on those CPUs; without `cpus` it may use all of them."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from orchestrator.devserver.cpus import client_cpus, confine_to, server_cpus
from orchestrator.devserver.local_server import start_server
from orchestrator.devserver.tiny_model import tiny_model_dir


def thread_cpus(pid: int) -> dict[int, set[int]]:
    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def answer_one(url: str) -> None:
    """One generation, so the model thread (and whatever else runs a step) exists."""
    body = {"model": str(tiny_model_dir()), "prompt": [1, 2, 3], "max_tokens": 2}
    reply = httpx.post(f"{url}/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text


def test_a_confined_server_runs_every_thread_on_its_cpus() -> None:
    wanted = server_cpus()
    server = start_server(threads=1, cpus=wanted)
    try:
        answer_one(server.url)
        threads = thread_cpus(server.pid)
        assert len(threads) >= 2, f"the HTTP loop and the model thread expected, found {threads}"
        assert all(cpus == wanted for cpus in threads.values()), threads
    finally:
        server.stop()


def test_an_unconfined_server_may_use_every_cpu_of_its_starter() -> None:
    server = start_server(threads=1)
    try:
        answer_one(server.url)
        threads = thread_cpus(server.pid)
        assert all(cpus == os.sched_getaffinity(0) for cpus in threads.values()), threads
    finally:
        server.stop()


def test_the_clients_get_the_cpu_the_server_leaves_and_children_inherit_a_confinement(tmp_path: Path) -> None:
    usable = os.sched_getaffinity(0)
    assert client_cpus() <= usable and len(client_cpus()) == 1
    if len(usable) > 1:
        assert not client_cpus() & server_cpus() and client_cpus() | server_cpus() == usable
    else:
        assert client_cpus() == server_cpus() == usable
    pid = os.fork()
    if pid == 0:   # the child: confined as a preexec_fn does, then reports what a grandchild would inherit
        try:
            confine_to(client_cpus())
            (tmp_path / "cpus").write_text(",".join(map(str, sorted(os.sched_getaffinity(0)))))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert set(map(int, (tmp_path / "cpus").read_text().split(","))) == client_cpus()
    assert os.sched_getaffinity(0) == usable, "confining a child must not confine its parent"

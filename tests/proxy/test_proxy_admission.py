"""A job's budgets hold whatever its harness sends at once (issue 34, item 4): they are counted at
admission, not when calls finish.
  * 12 concurrent calls (4 per API) under max_calls = 3: exactly 3 generations reach the backend;
    the other 9 get the refusal a sequential 4th call gets. (Before: 12 generations, 12 calls
    recorded: the limit counted finished calls.)
  * a call refused before it reaches the backend gives its call back (only generations count);
  * 16 concurrent 3.9 MB bodies under max_body_mb = 4: the job's proxy reads and parses one body's
    worth at a time, so the worker's peak memory grows as for one body (before: 12 MB for one,
    88 MB for 16 at once);
  * the history a job's proxy keeps converted is bounded in bytes: once it is full, 96 more
    refused requests with distinct 1 MB messages add nothing (before: +185 MB, kept until
    the job ended: a harness could grow its worker without bound, count_tokens included).
"""

from __future__ import annotations

import asyncio
import gc
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.proxy.recorder import ProxyLimits
from orchestrator.proxy.server import new_proxy_dir
from tests.proxy.conftest import Backend
from tests.proxy.jobs import Job

pytestmark = [pytest.mark.llm]
MB = 1 << 20
ANTHROPIC = {"anthropic-version": "2023-06-01"}
ASK = {   # one call per API, each answered by the scripted "Task sandbox." reply
    "chat": ("/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "Task sandbox."}]}, {}),
    "messages": ("/messages", {"model": "x", "max_tokens": 64,
                               "messages": [{"role": "user", "content": "Task sandbox."}]}, ANTHROPIC),
    "responses": ("/responses", {"model": "x", "input": "Task sandbox."}, {}),
}


def post(http: httpx.Client, api: str) -> httpx.Response:
    path, body, headers = ASK[api]
    return http.post(path, json=body, headers=headers)


def test_twelve_concurrent_calls_under_max_calls_3_give_3_generations(backend: Backend, tmp_path: Path) -> None:
    limits = ProxyLimits(max_calls=3, max_context_tokens=30000)
    generated_before = len(backend.records())
    apis = [api for api in ASK for _ in range(4)]
    start = threading.Barrier(len(apis))
    answers: dict[int, httpx.Response] = {}
    # Each generation is held 1 s before it is sent: all 12 calls are in the proxy at once.
    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-concurrent", delay=1.0, limits=limits) as job:
        def ask(index: int) -> None:
            with job.http(job.token) as http:
                start.wait(30)
                answers[index] = post(http, apis[index])

        threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(apis))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        with job.http(job.token) as http:
            sequential = {api: post(http, api) for api in ASK}   # what a 4th call after the 3 gets
        recorder = job.recorder
        assert recorder is not None
        generated = len(backend.records()) - generated_before
        statuses = sorted(a.status_code for a in answers.values())
        seen = f"{generated} generations, {len(recorder.calls)} recorded, statuses {statuses}"
        print(seen)
        assert generated == 3 and len(recorder.calls) == 3, seen
        answered = [i for i, a in answers.items() if a.status_code == 200]
        refused = [i for i, a in answers.items() if a.status_code != 200]
        assert len(answered) == 3 and len(refused) == 9, seen
        for api, answer in sequential.items():
            assert answer.status_code == 400 and "allows 3 model calls" in answer.text, answer.text
        for index in refused:
            assert (answers[index].status_code, answers[index].json()) == (400, sequential[apis[index]].json())
        assert recorder.stop_reason == "max_turns" and recorder.refused == 9 + 3


def test_a_call_refused_before_the_backend_gives_its_call_back(backend: Backend, tmp_path: Path) -> None:
    limits = ProxyLimits(max_calls=1, max_context_tokens=1000, max_chars_per_token=16)
    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-given-back", limits=limits) as job, \
            job.http(job.token) as http:
        too_long = http.post("/chat/completions", json={"model": "x", "messages": [
            {"role": "user", "content": "Task sandbox. " + "word " * 20_000}]})
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
        assert post(http, "chat").status_code == 200   # the one call the job allows is still there
        after = post(http, "chat")
        assert after.status_code == 400 and after.json()["error"]["code"] == "max_turns_reached"
        assert job.recorder is not None and len(job.recorder.calls) == 1


def memory_kb(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert found is not None, field
    return int(found.group(1))


CONCURRENT_BODIES = textwrap.dedent("""
    import socket, sys, threading, time
    path, token, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # a JSON body the proxy reads whole and parses, then refuses ('messages' is not a list)
    body = b'{"model": "x", "messages": "' + b"x" * (size - 32) + b'"}'
    head = (f"POST /v1/chat/completions HTTP/1.1\\r\\nHost: proxy\\r\\nAuthorization: Bearer {token}\\r\\n"
            f"Content-Type: application/json\\r\\nContent-Length: {len(body)}\\r\\n"
            "Connection: close\\r\\n\\r\\n").encode()
    statuses = []
    def send():
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(head + body[:-1000])
            time.sleep(0.5)                    # every body is being read at once (unless the proxy waits)
            sock.sendall(body[-1000:])
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            statuses.append(answer.split(b" ", 2)[1].decode())
    threads = [threading.Thread(target=send) for _ in range(count)]
    for thread in threads: thread.start()
    for thread in threads: thread.join()
    print(" ".join(sorted(statuses)))
""")


def test_concurrent_bodies_are_read_one_allowance_at_a_time(backend: Backend, tmp_path: Path) -> None:
    size = int(3.9 * MB)
    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-bodies", max_body_bytes=4 * MB) as job:
        def peak_growth_mb(bodies: int) -> tuple[float, str]:
            gc.collect()
            Path("/proc/self/clear_refs").write_text("5")   # peak RSS (VmHWM) from here on
            before = memory_kb("VmRSS")
            sent = subprocess.run([sys.executable, "-c", CONCURRENT_BODIES, job.socket, job.token, str(bodies),
                                   str(size)], capture_output=True, text=True, timeout=120)
            assert sent.stdout.split() == ["400"] * bodies, f"{sent.stdout!r} {sent.stderr[-500:]}"
            return (memory_kb("VmHWM") - before) / 1024, sent.stdout

        one, _ = peak_growth_mb(1)
        sixteen, _ = peak_growth_mb(16)
        assert job.recorder is not None and job.recorder.calls == []
    seen = f"peak RSS grew {one:.0f} MB for one 3.9 MB body, {sixteen:.0f} MB for 16 sent at once"
    print(seen)
    assert sixteen - one < 4 * size / MB, seen   # 16 held at once: 15 bodies more


def test_refused_requests_do_not_grow_the_jobs_converted_history(backend: Backend, tmp_path: Path) -> None:
    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-forms", max_body_bytes=2 * MB) as job, \
            job.http(job.token) as http:
        def refused(index: int) -> None:
            # the first message converts; the second is refused, so the request is (not a call)
            content = f"{index:06d}" + "y" * MB
            answer = http.post("/chat/completions", json={"model": "x", "messages": [
                {"role": "user", "content": content}, {"role": "nobody", "content": "?"}]})
            assert answer.status_code == 400 and "role" in answer.json()["error"]["message"], answer.text

        for index in range(48):   # the job's cache fills to its bound; the allocators' own growth settles
            refused(index)
        gc.collect()
        before = memory_kb("VmRSS")
        for index in range(48, 144):
            refused(index)
        gc.collect()
        grown_mb = (memory_kb("VmRSS") - before) / 1024
        assert post(http, "chat").status_code == 200
    seen = f"RSS grew {grown_mb:.0f} MB over 96 more refused requests with distinct 1 MB messages"
    print(seen)
    assert grown_mb < 64, seen   # kept, each would add ~2 MB (the message's JSON and its converted text)


def test_the_body_allowance_serves_in_order_and_passes_a_cancelled_turn_on() -> None:
    """BodyAllowance alone (real asyncio): never more than the allowance held, first come first
    served, and a waiter cancelled (its client gone, the proxy closing) neither keeps nor loses room."""
    from orchestrator.proxy.admission import BodyAllowance

    async def scenario() -> list[str]:
        intake, order, peak = BodyAllowance(10), [], [0]

        async def body(name: str, size: int | None, hold_s: float) -> None:
            async with intake.hold(size):
                peak[0] = max(peak[0], intake.held)
                order.append(name)
                await asyncio.sleep(hold_s)

        first = asyncio.create_task(body("a 6", 6, 0.2))
        await asyncio.sleep(0.01)
        waiting = [asyncio.create_task(body(name, size, 0.05)) for name, size in
                   (("b 6", 6), ("c chunked", None), ("d 2", 2), ("e 3", 3))]
        await asyncio.sleep(0.05)
        assert intake.held == 6 and order == ["a 6"]   # b does not fit; c, d and e wait behind it
        waiting[1].cancel()                            # the chunked one leaves while waiting
        await asyncio.gather(first, *waiting, return_exceptions=True)
        assert intake.held == 0 and peak[0] <= 10
        return order

    assert asyncio.run(scenario()) == ["a 6", "b 6", "d 2", "e 3"]

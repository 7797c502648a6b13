"""End to end: real serve-llm backends, real local workers, chat jobs, rows in shards.

Balance across 4 backends, stickiness, a backend added mid-run, a backend killed mid-run,
and a checkpoint swap mid-run.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.llm.inflight import read_load
from orchestrator.devserver.local_server import LocalServer, local_servers, start_server
from orchestrator.llm.registry import BackendRegistry, BackendState
from orchestrator.spool.paths import SpoolPaths
from tests.llm.e2e import LoadSampler, heavy_tailed_tasks, launch, new_run, rows, submit, wait

WORKERS, RUN_POOL = 4, 4


@pytest.fixture(scope="module")
def servers() -> Iterator[list[LocalServer]]:
    with local_servers(4, threads=1) as started:
        yield started


def steady_max_over_mean(samples: list[dict[str, int]], urls: list[str], capacity: int) -> list[float]:
    """max/mean in flight per backend, over the samples where every run slot was busy."""
    ratios = []
    for sample in samples:
        counts = [sample.get(url, 0) for url in urls]
        if sum(counts) >= capacity:
            ratios.append(max(counts) / statistics.mean(counts))
    return ratios


def wait_finished(paths: SpoolPaths, at_least: int, timeout_s: float = 120) -> None:
    """Until `at_least` tasks were assigned a backend and let it go (cluster-wide lifetime count)."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = read_load(paths)
        if sum(load.assigned.values()) - sum(load.inflight.values()) >= at_least:
            return
        assert time.monotonic() < deadline, f"fewer than {at_least} tasks finished after {timeout_s} s"
        time.sleep(0.02)


def wait_recorded(record: Path, turns: int, timeout_s: float = 120) -> None:
    """Until a server's --record file holds `turns` served requests."""
    deadline = time.monotonic() + timeout_s
    while not record.exists() or len(record.read_bytes().splitlines()) < turns:
        assert time.monotonic() < deadline, f"fewer than {turns} turns recorded in {record} after {timeout_s} s"
        time.sleep(0.02)


def assert_all_ok_and_sticky(found: list[dict], expected: int) -> None:
    assert len(found) == expected
    assert [r["error"] for r in found if r["status"] != "ok"] == []
    for row in found:
        backends = {t["backend"] for t in row["turns"]}
        switched = any(t["switched_from"] for t in row["turns"])
        assert len(backends) == 1 or switched, f"{row['job_id']} moved without a failure: {backends}"


def test_balance_with_four_backends_and_four_workers(tmp_path: Path, servers: list[LocalServer]) -> None:
    paths = new_run(tmp_path)
    urls = [s.url for s in servers]
    for url in urls:
        BackendRegistry.of(paths).add(url)
    # 128 tasks: 8 waves of the 16 slots. The steady state is measured on LLM work alone: the
    # workers load their tokenizers before RUN (orchestrator/worker/warm_up.py).
    # Replies of 16 tokens and more: each worker publishes its counts up to 50 ms late
    # (WORKER_PUBLISH_S, orchestrator/llm/inflight.py), so tasks must outlast that, as real ones
    # (seconds) do. Since serve-llm batches rows as `generate` does, replies from 4 tokens lasted
    # ~30 ms: picks on different workers landed on the same stale minimum (within one task of the
    # share in 0.47-0.83 of samples, 1.75 seen; 1.00 with counts published at once).
    submit(paths, heavy_tailed_tasks(128, shortest=16))
    with LoadSampler(paths) as sampler:
        wait(paths, launch(paths, WORKERS, RUN_POOL))
    found = rows(paths)
    assert_all_ok_and_sticky(found, 128)
    assert all(len({t["backend"] for t in r["turns"]}) == 1 for r in found)  # 100% sticky
    ratios = steady_max_over_mean(sampler.samples, urls, WORKERS * RUN_POOL)
    assert len(ratios) >= 10, "the run never reached steady state"
    # 16 tasks on 4 backends: max/mean moves in steps of 1/4 (1.25: the busiest holds one task
    # above its share), so a mean over a dozen samples moves by 0.02 with a single 1.5 (a mean of
    # 1.273 over 11 samples once failed a bound of 1.25). Judged instead: the share of samples
    # where the busiest is within one task of its share. Measured 0.83-1.00 (mean max/mean
    # 1.10-1.17, 27-53 samples, idle or beside a busy loop); random routing 0.09-0.23 (per sample
    # 0.31 for 16 tasks thrown at 4 backends).
    within_one = sum(r <= 1.25 for r in ratios) / len(ratios)
    print(f"steady state max/mean in flight: mean {statistics.mean(ratios):.3f}, median "
          f"{statistics.median(ratios):.3f}, within one task of the share {within_one:.2f}, {len(ratios)} samples")
    assert within_one >= 0.75, ratios
    per_backend = Counter(r["turns"][0]["backend"] for r in found)
    assert set(per_backend) == set(urls)


def test_backend_added_mid_run_gets_a_fair_share(tmp_path: Path, servers: list[LocalServer]) -> None:
    paths = new_run(tmp_path)
    registry = BackendRegistry.of(paths)
    for server in servers[:3]:
        registry.add(server.url)
    submit(paths, heavy_tailed_tasks(128, seed=1))
    process = launch(paths, WORKERS, RUN_POOL)
    # Add it in steady state: once the first wave (16 tasks, each worker's first loading its
    # tokenizer for seconds while it holds its pick) has finished. Added during that wave, the
    # new backend's share hung on how long those loads took (0.095 once in CI), not on routing.
    wait_finished(paths, 24)
    added_at = time.time()
    registry.add(servers[3].url)
    wait(paths, process)
    found = rows(paths)
    assert_all_ok_and_sticky(found, 128)
    # Picked after the add: the pick comes after RUN starts.
    later = [r for r in found if r["run_started_at"].timestamp() > added_at]
    per_backend = Counter(r["turns"][0]["backend"] for r in later)
    share = per_backend[servers[3].url] / len(later)
    print(f"added mid-run: {share:.3f} of the {len(later)} tasks picked after the add ({dict(per_backend)})")
    assert len(later) >= 64
    # Least in flight: it takes picks until level with the others, then a quarter. Measured
    # 0.20-0.39 in 16 runs on 2 CPUs, 11 of them beside busy loops; never picked, or picked
    # for everything, fails.
    assert 0.1 <= share <= 0.5, (share, per_backend)


def test_killed_backend_tasks_finish_on_the_others(tmp_path: Path, servers: list[LocalServer]) -> None:
    paths = new_run(tmp_path)
    victim_record = tmp_path / "victim.jsonl"
    victim = start_server(threads=1, record=victim_record)
    try:
        registry = BackendRegistry.of(paths)
        for url in (victim.url, servers[0].url, servers[1].url):
            registry.add(url)
        tasks = heavy_tailed_tasks(24, seed=2)
        for task in tasks:  # long enough that some are mid-conversation when the kill lands
            task["sampling"]["max_tokens"] = max(task["sampling"]["max_tokens"], 24)
        submit(paths, tasks)
        process = launch(paths, 2, RUN_POOL)
        wait_recorded(victim_record, 2)   # kill it once tasks have had turns there
        victim.kill()
        killed_at = time.time()
        wait(paths, process)
    finally:
        victim.stop()
    found = rows(paths)
    assert_all_ok_and_sticky(found, 24)
    assert registry.read().find(victim.url).state is BackendState.DOWN
    moved = [r for r in found if any(t["switched_from"] == victim.url for t in r["turns"])]
    assert moved, "no task was on the killed backend mid-conversation"
    for row in found:
        for turn in row["turns"]:
            if turn["sent_at"] > killed_at + 1.0:
                assert turn["backend"] != victim.url


def test_swap_mid_run_later_turns_carry_the_new_version(tmp_path: Path, servers: list[LocalServer]) -> None:
    paths = new_run(tmp_path)
    record = tmp_path / "record.jsonl"
    registry = BackendRegistry.of(paths)
    recorded = start_server(threads=1, record=record)  # its record tells when turns have happened
    try:
        urls = [recorded.url, servers[0].url]
        for url in urls:
            registry.add(url, version=3)
        tasks = heavy_tailed_tasks(24, seed=3)
        for task in tasks:  # 8 turns of 16 tokens: tasks in flight at the swap are mid-conversation
            task["user_turns"] = ["Go on.", "And then?", "More.", "Again.", "Next?", "Almost.", "Finish."]
            task["sampling"]["max_tokens"] = 16
        submit(paths, tasks)
        process = launch(paths, 2, RUN_POOL)
        # The conversations on the recorded server are at their 3rd turn or earlier, 5 or more turns
        # to go: still mid-conversation when the swap lands, even on a loaded machine (swapping
        # after 6 turns of 4-turn conversations once found every job in flight already finished).
        wait_recorded(record, 3)
        before = time.time()
        registry.swap(urls, version=4)
        after = time.time()
        wait(paths, process)
    finally:
        recorded.stop()
    found = rows(paths)
    assert_all_ok_and_sticky(found, 24)
    versions: Counter[int] = Counter()
    for row in found:
        for turn in row["turns"]:
            if turn["sent_at"] > after:
                assert turn["policy_version"] == 4, (turn["sent_at"] - after, row["job_id"])
            elif turn["sent_at"] < before:
                assert turn["policy_version"] == 3, (turn["sent_at"] - before, row["job_id"])
            versions[turn["policy_version"]] += 1
        assert row["policy_version_min"] == min(t["policy_version"] for t in row["turns"])
        assert row["policy_version_max"] == max(t["policy_version"] for t in row["turns"])
    spans = [(r["policy_version_min"], r["policy_version_max"], len(r["turns"])) for r in found]
    assert versions[3] and versions[4], (versions, spans)
    assert (3, 4) in {(lo, hi) for lo, hi, _ in spans}, (versions, spans)

"""Routing benchmark: decision cost under contention, and balance against the lifetime min-heap.

    python -m benchmarks.routing [--workers 32 --backends 64 --picks 100 --pace-ms 100 --tasks 512]

1. Decision cost: 64 backends, 32 worker processes picking and releasing at the same time
   through one spool directory (each pick reads the registry, every live worker's count file
   and rewrites its own). Each process pauses a random 0-200 ms between picks: 32 workers
   starting ~320 tasks/s together, a very busy cluster (tasks last seconds to hours); wall-clock median and p95 per pick, CPU per pick, and for reference the
   same with all 32 processes in a tight loop (on a 2-core machine that mostly measures the
   scheduler: 32 runnable processes share 2 cores).
2. Balance (discrete-event simulation with heavy-tailed task lengths, 4 workers x 4 slots):
   ours (the real Router, counts through the spool) vs the reference design (a min-heap of
   lifetime assignment counts that never decrease). max/mean tasks in flight per backend,
   averaged over every start/finish event while the queue is non-empty; then a backend added
   when two thirds of the tasks have started: the share of later tasks sent to it.
The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import heapq
import multiprocessing
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import Empty

from benchmarks.common import emit_json, parse_args
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import Router
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run


def touch_heartbeat(paths: SpoolPaths, worker_id: str) -> None:
    path = paths.heartbeat(worker_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")


# -- 1. decision cost ---------------------------------------------------------------------------
def pick_worker(root: str, worker_id: str, picks: int, pace_ms: float,
                start: "multiprocessing.synchronize.Barrier",
                out: "multiprocessing.Queue[tuple[list[float], list[float]]]") -> None:
    rng = random.Random(worker_id)
    paths = SpoolPaths.of(root)
    touch_heartbeat(paths, worker_id)
    router = Router(paths, worker_id, node=f"node-{worker_id}")
    held: list[str] = []
    costs: list[float] = []
    cpu: list[float] = []
    start.wait()
    for _ in range(picks):
        if pace_ms:  # tasks start now and then, not in a tight loop
            time.sleep(rng.uniform(0, 2 * pace_ms) / 1000)
        t0, c0 = time.perf_counter(), time.process_time()
        url = _acquire_sync(router)
        costs.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        held.append(url)
        if len(held) > 4:  # keep a few tasks in flight, like a worker with 4 slots
            router.release(held.pop(0))
    out.put((costs, cpu))


def _acquire_sync(router: Router) -> str:
    snapshot = router.registry.read()
    backend = router.choose(snapshot)
    router.board.change(backend.url, +1)
    return backend.url


def decision_cost(workers: int, backends: int, picks: int, pace_ms: float) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU milliseconds per pick, over every pick of every process."""
    with tempfile.TemporaryDirectory(prefix="routing-bench-") as root:
        paths, _ = init_run(root)   # a real run directory: past 16 workers the cluster summary needs control/
        registry = BackendRegistry(paths)
        registry.swap([f"http://node{i:03d}:8000/v1" for i in range(backends)], version=1)
        ctx = multiprocessing.get_context("fork")
        barrier = ctx.Barrier(workers)
        queue: multiprocessing.Queue[tuple[list[float], list[float]]] = ctx.Queue()
        procs = [ctx.Process(target=pick_worker, args=(root, f"w{i:03d}", picks, pace_ms, barrier, queue))
                 for i in range(workers)]
        for p in procs:
            p.start()
        results = collect(queue, procs, timeout_s=300)
        for p in procs:
            p.join(60)
        return [c for r in results for c in r[0]], [c for r in results for c in r[1]]


def collect(queue: "multiprocessing.Queue[tuple[list[float], list[float]]]",
            procs: Sequence[multiprocessing.process.BaseProcess],
            timeout_s: float) -> list[tuple[list[float], list[float]]]:
    """One result per process; raises at once when one of them died (its traceback is above)."""
    results: list[tuple[list[float], list[float]]] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < len(procs):
        try:
            results.append(queue.get(timeout=0.5))
        except Empty:
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"{len(failed)} picking process(es) failed (exit code {failed[0].exitcode})") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(procs) - len(results)} picking process(es) silent for {timeout_s:.0f} s") from None
    return results


# -- 2. balance ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    tasks: int
    backends: int
    workers: int = 4
    slots: int = 4
    add_at: float | None = None   # fraction of tasks started when one more backend is added
    seed: int = 0


class HeapPolicy:
    """The reference: pop the backend with the fewest lifetime assignments; never decrement."""

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, str]] = []
        self.order = 0

    def add(self, url: str) -> None:
        heapq.heappush(self.heap, (0, self.order, url))
        self.order += 1

    def pick(self, worker: int) -> str:
        count, order, url = heapq.heappop(self.heap)
        heapq.heappush(self.heap, (count + 1, order, url))
        return url

    def release(self, worker: int, url: str) -> None:
        pass


class OurPolicy:
    """The real Router, one per simulated worker, sharing counts through a spool directory."""

    def __init__(self, root: Path, workers: int) -> None:
        self.paths, _ = init_run(root)
        self.registry = BackendRegistry(self.paths)
        self.routers = []
        for w in range(workers):
            touch_heartbeat(self.paths, f"sim{w}")
            self.routers.append(Router(self.paths, f"sim{w}", node="sim"))

    def add(self, url: str) -> None:
        self.registry.add(url, node="sim")

    def pick(self, worker: int) -> str:
        return _acquire_sync(self.routers[worker])

    def release(self, worker: int, url: str) -> None:
        self.routers[worker].release(url)


@dataclass(frozen=True)
class BalanceResult:
    max_over_mean: float
    added_share: float | None


def simulate(scenario: Scenario, policy: HeapPolicy | OurPolicy) -> BalanceResult:
    rng = random.Random(scenario.seed)
    durations = [rng.paretovariate(1.3) for _ in range(scenario.tasks)]  # heavy tail
    urls = [f"http://node{i:03d}:8000/v1" for i in range(scenario.backends)]
    for url in urls:
        policy.add(url)
    new_url = f"http://node{scenario.backends:03d}:8000/v1"
    inflight: Counter[str] = Counter()
    events: list[tuple[float, int, int, str]] = []   # (finish time, seq, worker, url)
    started = 0
    added_after: list[str] = []
    ratios: list[float] = []
    seq = 0
    now = 0.0

    def start(worker: int) -> None:
        nonlocal started, seq
        if scenario.add_at is not None and started == int(scenario.add_at * scenario.tasks):
            policy.add(new_url)
            urls.append(new_url)
        url = policy.pick(worker)
        if scenario.add_at is not None and new_url in urls:
            added_after.append(url)
        inflight[url] += 1
        heapq.heappush(events, (now + durations[started], seq, worker, url))
        started += 1
        seq += 1

    def sample() -> None:
        counts = [inflight.get(u, 0) for u in urls]
        ratios.append(max(counts) / statistics.mean(counts))

    for worker in range(scenario.workers):
        for _ in range(scenario.slots):
            if started < scenario.tasks:
                start(worker)
    while events:
        now, _, worker, url = heapq.heappop(events)
        inflight[url] -= 1
        policy.release(worker, url)
        if started < scenario.tasks:
            start(worker)
            sample()  # steady state: every slot is busy
    share = None
    if added_after:
        share = sum(u == new_url for u in added_after) / len(added_after)
    return BalanceResult(statistics.mean(ratios), share)


def run_balance(scenario: Scenario) -> tuple[BalanceResult, BalanceResult]:
    with tempfile.TemporaryDirectory(prefix="routing-sim-") as root:
        ours = simulate(scenario, OurPolicy(Path(root), scenario.workers))
    heap = simulate(scenario, HeapPolicy())
    return ours, heap


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"workers": 18, "backends": 8, "picks": 3, "pace_ms": 20.0, "tasks": 64}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=32, help="contending worker processes")
    parser.add_argument("--backends", type=int, default=64)
    parser.add_argument("--picks", type=int, default=100, help="picks per worker process")
    parser.add_argument("--pace-ms", type=float, default=100.0,
                        help="mean pause between two picks of one process (0: tight loop)")
    parser.add_argument("--tasks", type=int, default=512, help="tasks in the balance simulation")
    args = parse_args(parser, QUICK, argv)

    costs, cpu = decision_cost(args.workers, args.backends, args.picks, args.pace_ms)
    tight, _ = decision_cost(args.workers, args.backends, max(args.picks // 4, 10), 0.0)
    costs.sort()
    median = statistics.median(costs)
    p95 = costs[int(0.95 * (len(costs) - 1))]
    steady_ours, steady_heap = run_balance(Scenario(args.tasks, 4, seed=1))
    added_ours, added_heap = run_balance(Scenario(args.tasks, 3, add_at=2 / 3, seed=2))

    rows: list[tuple[str, str, str]] = [
        (f"pick cost, {args.backends} backends, {args.workers} processes: median ms", f"{median:.3f}", ""),
        ("pick cost: p95 ms", f"{p95:.3f}", ""),
        ("pick cost: CPU ms per pick (median)", f"{statistics.median(cpu):.3f}", ""),
        (f"pick cost, all {args.workers} in a tight loop: median ms", f"{statistics.median(tight):.3f}", ""),
        ("max/mean in flight per backend (4 backends)", f"{steady_ours.max_over_mean:.3f}",
         f"{steady_heap.max_over_mean:.3f}"),
        ("max/mean in flight with a backend added mid-run", f"{added_ours.max_over_mean:.3f}",
         f"{added_heap.max_over_mean:.3f}"),
        ("share of later tasks to the added backend (fair 0.25)", f"{added_ours.added_share:.3f}",
         f"{added_heap.added_share:.3f}"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'ours':>9}  {'min-heap':>9}")
    print("-" * (width + 22))
    for name, ours, heap in rows:
        print(f"{name:<{width}}  {ours:>9}  {heap:>9}")
    emit_json({
        "pick_median_ms": round(median, 4),
        "ours_max_over_mean": round(steady_ours.max_over_mean, 4),
        "heap_max_over_mean": round(steady_heap.max_over_mean, 4),
        "ours_added_mid_run_share": round(added_ours.added_share or 0.0, 4),
        "heap_added_mid_run_share": round(added_heap.added_share or 0.0, 4),
    })


if __name__ == "__main__":
    main()

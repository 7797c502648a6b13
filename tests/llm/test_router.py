"""Least-in-flight routing across workers, lease expiry, tie-breaks, health marking."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, RunConfig
from orchestrator.llm.errors import NoBackendAvailable
from orchestrator.llm.inflight import read_load
from orchestrator.spool import lease
from orchestrator.llm.registry import BackendRegistry, BackendState
from orchestrator.llm.router import Router, router_for
from orchestrator.spool.paths import SpoolPaths
from orchestrator.worker.engine import Worker
from orchestrator.worker.options import WorkerOptions
from tests.llm.helpers import heartbeat, run_dir
from tests.core.util import make_run
from tests.llm.standin import StandIn

A, B, C = "http://a:1/v1", "http://b:1/v1", "http://c:1/v1"


def setup(tmp_path: Path, urls: list[str]):
    paths = run_dir(tmp_path)
    registry = BackendRegistry.of(paths)
    for url in urls:
        registry.add(url, node="n-" + url[7])
    return paths, registry


def test_picks_fewest_in_flight_across_workers(tmp_path: Path) -> None:
    paths, _ = setup(tmp_path, [A, B, C])
    w1, w2 = Router(paths, "w1", node="x"), Router(paths, "w2", node="y")
    heartbeat(paths, "w1"), heartbeat(paths, "w2")
    picks = [asyncio.run(w1.acquire()).url for _ in range(2)]
    picks += [asyncio.run(w2.acquire()).url for _ in range(4)]
    load = read_load(paths)
    assert sorted(load.inflight.values()) == [2, 2, 2]  # w2 saw w1's tasks through the spool
    assert len(set(picks[:3])) == 3
    w1.release(picks[0])
    assert asyncio.run(w2.acquire()).url == picks[0]  # the freed slot is the least loaded


def test_dead_workers_counts_vanish_with_the_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]   # this process's own clock: it judges a heartbeat by whether it changes
    monkeypatch.setattr(lease.SIGHTINGS, "clock", lambda: clock[0])
    paths, _ = setup(tmp_path, [A, B])
    dead = Router(paths, "dead", node="x", lease_s=30)
    heartbeat(paths, "dead")
    for _ in range(2):
        dead.board.change(A, +1)
    alive = Router(paths, "alive", node="x", lease_s=30)
    assert alive.board.read().inflight == {A: 2}
    clock[0] += 31   # the worker stopped heartbeating: its heartbeat stayed the same for a lease
    load = alive.board.read()
    assert load.inflight == {} and load.assigned == {A: 2}
    assert asyncio.run(alive.acquire()).url == B  # equal in flight: fewer lifetime assignments


def test_prefers_own_node_on_ties(tmp_path: Path) -> None:
    paths, _ = setup(tmp_path, [A, B, C])
    router = Router(paths, "w1", node="n-b")
    assert asyncio.run(router.acquire()).url == B


def test_draining_and_down_backends_get_no_new_tasks(tmp_path: Path) -> None:
    paths, registry = setup(tmp_path, [A, B])
    registry.set_state(A, BackendState.DRAINING)
    router = Router(paths, "w1", node="x")
    assert {asyncio.run(router.acquire()).url for _ in range(3)} == {B}
    router.mark_down(B, "connection refused")
    assert registry.read().find(B).state is BackendState.DOWN
    assert registry.read().find(B).reason == "connection refused"
    with pytest.raises(NoBackendAvailable, match="draining.*down"):
        asyncio.run(router.acquire())


def test_empty_registry_names_the_fix(tmp_path: Path) -> None:
    paths = run_dir(tmp_path)
    with pytest.raises(NoBackendAvailable, match="hpc-rollout backend add"):
        asyncio.run(Router(paths, "w1").acquire())


def test_down_backend_is_probed_and_revived(tmp_path: Path) -> None:
    with StandIn() as server:
        paths, registry = setup(tmp_path, [server.url])
        router = Router(paths, "w1", node="x", probe_after_s=0.0)
        router.mark_down(server.url, "HTTP 503")
        server.healthy = False
        with pytest.raises(NoBackendAvailable):
            asyncio.run(router.acquire())
        assert registry.read().find(server.url).state is BackendState.DOWN
        server.healthy = True
        assert asyncio.run(router.acquire()).url == server.url
        assert registry.read().find(server.url).state is BackendState.UP


def test_a_backend_failing_its_health_check_gets_no_task(tmp_path: Path) -> None:
    with StandIn() as sick, StandIn() as well:
        sick.healthy = False
        paths, registry = setup(tmp_path, [sick.url, well.url])
        router = Router(paths, "w1", node="x", health_check_s=30.0)
        assert [asyncio.run(router.acquire()).url for _ in range(3)] == [well.url] * 3
        entry = registry.read().find(sick.url)
        assert entry.state is BackendState.DOWN and "/health" in entry.reason
        # A backend that answered recently is not asked again before every task.
        assert well.health_checks == 1 and sick.health_checks == 1
        load = read_load(paths)
        assert sick.url not in load.assigned and sick.url not in load.inflight  # the pick was taken back


def test_tasks_picking_together_while_health_checks_run_spread_out(tmp_path: Path) -> None:
    with StandIn() as a, StandIn() as b, StandIn() as c, StandIn() as d:
        urls = [a.url, b.url, c.url, d.url]
        paths, _ = setup(tmp_path, urls)
        router = Router(paths, "w1", node="x", health_check_s=30.0)

        async def four_at_once() -> list[str]:
            return [backend.url for backend in await asyncio.gather(*(router.acquire() for _ in range(4)))]

        assert sorted(asyncio.run(four_at_once())) == sorted(urls)


def test_health_checks_follow_run_toml(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"llm.health_check_s": 0, "llm.probe_after_s": 5})
    router = router_for(paths, "w-health")
    assert (router.health_check_s, router.probe_after_s) == (0, 5)
    with StandIn() as sick:
        sick.healthy = False
        BackendRegistry.of(paths).add(sick.url)
        asyncio.run(router.acquire())  # checks off: the pick trusts the registry
        assert sick.health_checks == 0
    with pytest.raises(ConfigError, match="not a run directory"):   # no silent defaults for a bare directory
        router_for(SpoolPaths.of(tmp_path / "bare"), "w-bare")


def test_a_broken_run_toml_is_an_error_not_silent_defaults(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    paths.run_config.write_text("[llm]\nhealth_check_s = 'often'\n")
    with pytest.raises(ConfigError, match="health_check_s"):
        router_for(paths, "w-broken")


def test_the_worker_builds_its_router_from_its_run_config_and_injects_it(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"llm.health_check_s": 0, "llm.probe_after_s": 7})
    config = RunConfig.load(paths.run_config)
    worker = Worker(paths, config, WorkerOptions())
    router = worker.state.services.llm_router
    assert isinstance(router, Router) and router.worker_id == worker.worker_id
    assert (router.health_check_s, router.probe_after_s, router.lease_s) == (0, 7, config.leases.lease_s)


def test_counts_held_back_on_a_large_run_go_out_with_the_workers_heartbeat(tmp_path: Path) -> None:
    """On a large run a board publishes at most every few seconds; a worker whose tasks run long
    makes no new pick, so its heartbeat must publish what was held back (others route on it)."""
    import time

    import orjson

    paths = make_run(tmp_path / "run")
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions())
    worker.state.box.dir.mkdir(parents=True, exist_ok=True)   # its claim directory, as a started worker has
    router = worker.state.services.llm_router
    assert router is not None
    router.board.publish_every_s = 0.2
    url = "http://127.0.0.1:9/v1"
    router.board.change(url, +1)
    router.board.change(url, +1)   # within the period: held back
    def published() -> int | None:
        return orjson.loads(router.board.own_file.read_bytes())["inflight"].get(url)

    assert published() == 1
    time.sleep(0.3)
    try:
        asyncio.run(worker.housekeeping.beat())
    finally:
        worker.state.heartbeat_io.shutdown(wait=True)
    assert published() == 2
    # and the heartbeat carries the counts itself: on a large run it is all the cluster summary reads
    assert orjson.loads(paths.heartbeat(worker.worker_id).read_bytes())["load"]["inflight"] == {url: 2}


def test_tasks_that_start_together_cost_one_board_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's answers reach a worker together, and its next tasks start together: their +1s
    and -1s are published in one write at the end of the event loop's round, not one each.
    Other workers see them before the loop next waits."""
    from orchestrator.llm import inflight

    paths, _ = setup(tmp_path, [A, B])
    heartbeat(paths, "w1")
    router = Router(paths, "w1", node="x")
    writes: list[dict] = []
    original = inflight.write_json_atomic
    monkeypatch.setattr(inflight, "write_json_atomic", lambda path, data, **kw: (writes.append(data), original(path, data, **kw)))

    async def burst() -> tuple[int, dict[str, int]]:
        for _ in range(8):
            router.board.change(A, +1)
        router.board.change(B, +1)
        router.board.change(B, -1)
        held = len(writes)
        await asyncio.sleep(0)
        return held, read_load(paths).inflight

    held, seen = asyncio.run(burst())
    assert held == 0 and seen == {A: 8}
    assert len(writes) == 1
    # outside an event loop (a script, a test) a change is published at once, as before
    router.board.change(A, -1)
    assert len(writes) == 2 and read_load(paths).inflight == {A: 7}


def test_a_busy_worker_writes_its_board_once_per_period_and_never_holds_a_change_back_longer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's counts change at every job it starts and ends (rounds apart as answers trickle
    in): each write is a create and a rename on the metadata server, so a worker writes at most
    once per WORKER_PUBLISH_S. The last change is written when the period ends, not at the next
    change, and going idle is written at once. A bare Router (no worker) writes every change."""
    import time

    from orchestrator.llm import inflight

    paths, registry = setup(tmp_path, [A, B])
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions())
    router = worker.state.services.llm_router
    assert router is not None
    heartbeat(paths, worker.worker_id)
    writes: list[dict] = []
    original = inflight.write_json_atomic
    monkeypatch.setattr(inflight, "write_json_atomic", lambda path, data, **kw: (writes.append(data), original(path, data, **kw)))

    async def trickle() -> tuple[float, dict[str, int], dict[str, int]]:
        router.choose(registry.read())   # the worker's period, as every pick sets it
        period = router.board.publish_every_s
        for _ in range(40):              # 40 jobs start and end, each in a round of its own
            router.board.change(A, +1)
            await asyncio.sleep(0)
            router.board.change(B, +1)
            await asyncio.sleep(0.001)
            router.board.change(A, -1)
        seen_before = read_load(paths).inflight
        await asyncio.sleep(period + 0.05)
        return period, seen_before, read_load(paths).inflight

    began = time.monotonic()
    period, before, after = asyncio.run(trickle())
    elapsed = time.monotonic() - began
    assert period == inflight.WORKER_PUBLISH_S > 0
    assert len(writes) <= elapsed / period + 2, f"{len(writes)} writes in {elapsed:.3f} s"
    assert after == {B: 40}   # the last change was written when its period ended
    assert before != after or len(writes) == 1
    writes.clear()

    async def go_idle() -> None:
        router.board.change(B, -40)
        assert len(writes) == 1 and read_load(paths).inflight == {}   # idle: at once, not a period later

    asyncio.run(go_idle())

    bare = Router(paths, "bare", node="x")   # outside a worker: every change, as a script's loop may end first
    bare.choose(registry.read())
    assert bare.board.publish_every_s == 0.0


def test_sessions_outside_a_worker_close_their_connections_when_the_last_ends_never_a_worker_s(
        tmp_path: Path) -> None:
    """Outside a worker (no router injected) session_for uses router_for's router: its keep-alive
    connections must close when its last session ends, not linger until the process exits
    ("Unclosed client session"). A worker's router outlives its tasks' sessions."""
    from aiohttp import web

    from orchestrator.llm.session import session_for
    from tests.llm.helpers import make_ctx

    paths = run_dir(tmp_path)

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def go() -> tuple[bool, bool, bool]:
        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/health"
        worker_router = router_for(paths, "w-worker", "testnode")
        try:
            # Two sessions outside a worker share router_for's router: the first to end leaves the
            # other's connections open; the last closes them.
            async with session_for(make_ctx(paths, "w-alone", "g-0", {})) as first:
                async with session_for(make_ctx(paths, "w-alone", "g-1", {})) as second:
                    assert first.router is second.router
                    own = second.router.connections.client()
                    assert (await own.get(url)).status == 200
                open_after_one = not own.closed and (await first.router.connections.client().get(url)).status == 200
            async with session_for(make_ctx(paths, "w-worker", "g-2", {}, router=worker_router)) as task:
                shared = task.router.connections.client()
                assert (await shared.get(url)).status == 200
            return open_after_one, own.closed, shared.closed
        finally:
            await worker_router.close()
            await runner.cleanup()

    assert asyncio.run(go()) == (True, True, False)

"""Rolling weight updates (swap_weights(..., rolling=True)) on real serve-llm backends.

Three `serve-llm --tiny` servers whose reload holds generation for RELOAD_DELAY_S (a large
model's load time), chat jobs running through a real worker while the backends reload in waves:
some backend always serves, no turn goes to a draining backend, every row stays within the lag
bound; a backend that fails its reload ends the swap with a clear error and nothing draining.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.devserver.local_server import LocalServer, local_servers
from orchestrator.devserver.tiny_model import save_perturbed_copy, tiny_model_dir
from orchestrator.llm.history import read_history
from orchestrator.llm.registry import Backend, BackendRegistry, BackendState, Snapshot
from orchestrator.llm.router import Router
from orchestrator.llm.weights import ReloadFailed, RollingRefused, plan_waves
from orchestrator.trainer.api import Spool
from tests.core.util import FAST, rows, start_worker, stop_worker, wait_drained, wait_until
from tests.llm.helpers import chat_instance
from tests.llm.standin import StandIn

pytestmark = pytest.mark.llm
RELOAD_DELAY_S = 1.0
LAG = 1


@pytest.fixture(scope="module")
def servers() -> Iterator[list[LocalServer]]:
    with local_servers(3, threads=1, extra_args=["--reload-delay-s", str(RELOAD_DELAY_S)]) as started:
        yield started


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_perturbed_copy(tiny_model_dir(), tmp_path_factory.mktemp("ckpt") / "ckpt-1", seed=1, scale=0.01)


def new_spool(tmp_path: Path, urls: list[str], **settings: Any) -> Spool:
    spool = Spool.create(tmp_path / "run", **{**FAST, "trainer.max_policy_lag": LAG, **settings})
    for url in urls:
        BackendRegistry(spool.paths).add(url, version=0)
    return spool


# -- the plan, without servers ----------------------------------------------------------------------
def backend(url: str, version: int = 0, state: BackendState = BackendState.UP) -> Backend:
    return Backend(url=url, policy_version=version, state=state)


def test_waves_keep_the_share_serving() -> None:
    four = [backend(f"http://b{i}:8000/v1") for i in range(4)]
    assert [len(w) for w in plan_waves(four, 0.5)] == [2, 2]
    assert [len(w) for w in plan_waves(four, 0.75)] == [1, 1, 1, 1]
    five = [backend(f"http://b{i}:8000/v1") for i in range(5)]
    assert [len(w) for w in plan_waves(five, 0.5)] == [2, 2, 1]   # 3 of 5 serve at every moment
    # a backend drained by hand serves nothing: it reloads in the first wave, beside the share's
    drained = [backend("http://d:8000/v1", state=BackendState.DRAINING), *four]
    assert [sorted(b.url for b in w) for w in plan_waves(drained, 0.5)][0] == \
        ["http://b0:8000/v1", "http://b1:8000/v1", "http://d:8000/v1"]
    with pytest.raises(RollingRefused, match="at least 2 backends"):
        plan_waves(four[:1], 0.5)
    with pytest.raises(RollingRefused, match="min_serving"):
        plan_waves(four, 1.0)


def test_new_tasks_prefer_backends_at_the_newest_version(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run")
    router = Router(spool.paths, "w1")
    old, new = backend("http://old:8000/v1", 3), backend("http://new:8000/v1", 4)
    snapshot = Snapshot(4, (old, new))
    for _ in range(5):   # even with more in flight on the new one
        url = router.choose(snapshot).url
        assert url == new.url
        router.board.change(url, +1)
    draining = Snapshot(4, (old, backend("http://new:8000/v1", 4, BackendState.DRAINING)))
    assert router.choose(draining).url == old.url   # an older one still beats none


def test_rolling_refuses_a_lag_of_zero_and_a_single_backend(tmp_path: Path, servers: list[LocalServer],
                                                           checkpoint: Path) -> None:
    spool = new_spool(tmp_path, [s.url for s in servers])
    with pytest.raises(RollingRefused, match=r"max_policy_lag.*>= 1.*rolling=False") as refused:
        spool.swap_weights(checkpoint, version=1, max_policy_lag=0, rolling=True)
    print(refused.value)
    # lag 1 but a jump of two versions: the backends not yet reloaded would be 2 behind
    with pytest.raises(RollingRefused, match="max_policy_lag"):
        spool.swap_weights(checkpoint, version=2, max_policy_lag=1, rolling=True)
    after = BackendRegistry(spool.paths).read()
    assert after.policy_version == 0 and {b.state for b in after.backends} == {BackendState.UP}
    assert {b.policy_version for b in after.backends} == {0}

    single = Spool.create(tmp_path / "single", **{"trainer.max_policy_lag": LAG})
    BackendRegistry(single.paths).add(servers[0].url, version=0)
    with pytest.raises(RollingRefused, match="at least 2 backends"):
        single.swap_weights(checkpoint, version=1, rolling=True)


# -- under load ----------------------------------------------------------------------------------------
def intervals(history: list[dict[str, Any]], state: str) -> dict[str, list[tuple[float, float]]]:
    """Per backend, the times it spent in `state` (history.jsonl's state changes)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for line in history:
        url = line["url"]
        if line.get("change") == "state" and line["state"] == state:
            since[url] = line["t"]
        elif line.get("change") == "state" and line.get("from_state") == state and url in since:
            spans.setdefault(url, []).append((since.pop(url), line["t"]))
    for url, start in since.items():
        spans.setdefault(url, []).append((start, float("inf")))
    return spans


class StatePoller:
    """How many backends are `up` in the registry, read as often as it can be, from a thread."""

    def __init__(self, spool: Spool) -> None:
        self.registry = BackendRegistry(spool.paths)
        self.fewest_up: int | None = None
        self.saw_draining = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            snap = self.registry.read()
            up = sum(b.state is BackendState.UP for b in snap.backends)
            self.fewest_up = up if self.fewest_up is None else min(self.fewest_up, up)
            self.saw_draining |= any(b.state is BackendState.DRAINING for b in snap.backends)
            time.sleep(0.005)

    def __enter__(self) -> "StatePoller":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)


def test_rolling_swap_under_load(tmp_path: Path, servers: list[LocalServer], checkpoint: Path) -> None:
    urls = [s.url for s in servers]
    spool = new_spool(tmp_path, urls, **{"pools.run": 6})
    # 12 chat jobs of 6 turns: conversations are mid-way on every backend when the swap starts
    spool.submit([chat_instance(n_user_turns=5)] * 12, handler="chat", sampling={"max_tokens": 12})
    worker = start_worker(spool.paths)
    try:
        wait_until(lambda: _turns_started(spool) >= 6, 120, "the first turns")
        with StatePoller(spool) as poller:
            asked = time.time()
            report = spool.swap_weights(checkpoint, version=1, rolling=True)
            confirmed = time.time()
            # and a second one at once: rows that began on version 0 are now beyond the bound
            second = spool.swap_weights(tiny_model_dir(), version=2, rolling=True)
            moved = time.time()
        wait_drained(spool.paths, timeout=240)
    finally:
        stop_worker(worker)

    # some backend always served: with 3 backends and the default share (0.5), 2 at every moment
    assert poller.saw_draining and poller.fewest_up is not None and poller.fewest_up >= 2
    assert [len(w) for w in report.waves] == [1, 1, 1] and report.seconds >= 3 * RELOAD_DELAY_S
    assert len(second.waves) == 3
    final = BackendRegistry(spool.paths).read()
    assert final.policy_version == 2 and final.min_policy_version == 2 - LAG
    assert {(b.state, b.policy_version) for b in final.backends} == {(BackendState.UP, 2)}

    finished = rows(spool.paths)
    assert len(finished) == 12
    ok = [r for r in finished if r["status"] == "ok"]
    assert ok and all(r["error"].startswith("stale_policy") for r in finished if r["status"] != "ok"), \
        [r["error"] for r in finished]
    turns = [t for r in finished for t in r["turns"]]
    assert any(asked < t["sent_at"] < confirmed and t["policy_version"] == 0 for t in turns), \
        "no turn served during the swap"
    assert all(t["policy_version"] >= 1 for t in turns if t["sent_at"] > confirmed)
    assert all(t["policy_version"] == 2 for t in turns if t["sent_at"] > moved)
    # no turn was sent to a backend while it was draining
    history, _ = read_history(spool.paths.backends_history)
    draining = intervals(history, "draining")
    assert set(draining) == set(urls)
    for turn in turns:
        for start, end in draining.get(turn["backend"], []):
            assert not start < turn["sent_at"] < end, (turn["backend"], turn["sent_at"] - start)
    # every row trained on stays within the lag bound
    for row in ok:
        assert row["policy_version_max"] - row["policy_version_min"] <= LAG, row["job_id"]


def _turns_started(spool: Spool) -> int:
    from orchestrator.llm.inflight import read_load

    return sum(read_load(spool.paths).assigned.values())


def test_a_failed_backend_ends_the_swap_with_nothing_draining(tmp_path: Path, servers: list[LocalServer],
                                                             checkpoint: Path) -> None:
    with StandIn() as broken:   # speaks SGLang without a reload route: its reload fails
        spool = Spool.create(tmp_path / "run", **{"trainer.max_policy_lag": LAG})
        registry = BackendRegistry(spool.paths)
        registry.add(servers[0].url, version=0)
        registry.add(broken.url, protocol="sglang", version=0)
        registry.add(servers[1].url, version=0)
        with pytest.raises(ReloadFailed) as failed:   # waves: [servers[0]], [broken], [servers[1]]
            spool.swap_weights(checkpoint, version=1, rolling=True)
        after = registry.read()
    message = str(failed.value)
    print(message)
    assert broken.url in message and "version 1: " + servers[0].url in message
    assert "version 0: " + servers[1].url in message
    assert failed.value.versions == {servers[0].url: 1, broken.url: 0, servers[1].url: 0}
    states = {b.url: b.state for b in after.backends}
    assert BackendState.DRAINING not in states.values()
    assert states == {servers[0].url: BackendState.UP, broken.url: BackendState.DOWN, servers[1].url: BackendState.UP}
    assert after.find(broken.url).reason.startswith("reload")   # type: ignore[union-attr]
    assert after.policy_version == 1 and after.find(servers[1].url).policy_version == 0   # type: ignore[union-attr]

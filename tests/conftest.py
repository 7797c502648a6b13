"""Scheduling of the whole suite for parallel runs (scripts/test.sh: `pytest -n 2 --dist loadgroup`).

Every test gets an `xdist_group`, the unit a worker runs whole:
- the Slurm tests share one cluster (and expect its nodes to be theirs): one group, one worker
  (tests/slurm/ and any test marked `slurm`, such as a benchmark launching arrays);
- each benchmark of tests/test_benchmarks.py is a unit of its own (minutes of waiting in all);
- the tests on the session's stock vLLM server: one group, so that one server is started;
- every other test: its module, so that a module-scoped fixture (a server, a finished run) is
  set up once, on one worker; a module whose such fixture is parametrized (PER_PARAMETER: verl's
  fit() of tests/verl/test_fit.py, once per trainer) is a group per parameter, for two workers.
The order of the units is the order the workers take them: the long, wait-bound Slurm group
first, then the longest modules; the tests of the task image (built in the background by scripts/test.sh), of vLLM and of verl
(installed in the background) last, so that their builds overlap the rest. With warm caches (all
of those ended before pytest started: HPC_ROLLOUT_HEAVY_FIRST=1 from scripts/test.sh) they come
right after the Slurm group instead: their minutes of CPU overlap its waiting (rank_of).
Without xdist the marks do nothing but the order applies as well.

It also marks the fast tier (`python -m pytest -m fast`; the rule and its list: tests/tiers.py):
the tests that run in the pytest process, each guarded in every run so that none starts a program,
a server or the tiny model; with `-m fast` the other modules are not even collected.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, ContextManager, Generator

import pytest

from tests import tiers

SLURM_GROUP = "slurm"
VLLM_SERVER_GROUP = "vllm-server"
BACKGROUND_FIXTURES = ("task_image", "vllm_python", "vllm_server", "mini_swe_agent_venv", "verifiers_venv", "harness_image")
# The longest modules (minutes each, measured with --durations): started early, so that no
# worker is left with one of them at the end while the other idles.
LONG_MODULES = ("tests/trainer/test_closed_loop.py", "tests/report/test_report_run.py", "tests/llm/test_balance.py")


# Module-scoped fixtures with parameters, each parameter minutes of work of its own.
PER_PARAMETER = ("fit",)


def group_of(item: pytest.Item) -> str:
    path = item.path.as_posix()
    if "/tests/slurm/" in path or item.get_closest_marker("slurm"):
        return SLURM_GROUP
    if path.endswith("/tests/test_benchmarks.py"):
        return item.nodeid   # each benchmark alone: the two workers share them
    if "vllm_server" in getattr(item, "fixturenames", ()):
        return VLLM_SERVER_GROUP
    module = item.nodeid.split("::", 1)[0]
    params = getattr(getattr(item, "callspec", None), "params", {})
    chosen = [f"{name}={params[name]}" for name in PER_PARAMETER if name in params]
    # No "]" in a group name: xdist reads the group after the last "@" only when no "]" follows it
    # (LoadGroupScheduling._split_scope), and a name ending in one made every test its own unit.
    return f"{module} ({','.join(chosen)})" if chosen else module


def rank_of(item: pytest.Item, group: str) -> int:
    """The order groups are handed to the workers in: the Slurm group first (one worker, mostly
    waiting); then, when scripts/test.sh found every background install and build done before
    pytest started (warm caches: HPC_ROLLOUT_HEAVY_FIRST=1), the tests of vLLM, verl and the images
    (minutes of CPU each), so that they fill the CPUs the waiting tests leave idle and the many short
    groups balance the workers at the end; the long modules; the rest; last, the tests waiting for
    what is still being installed or built."""
    if group == SLURM_GROUP:
        return 0
    fixtures = getattr(item, "fixturenames", ())
    if any(f"/tests/{heavy}/" in item.path.as_posix() for heavy in ("vllm", "verl")) \
            or any(name in fixtures for name in BACKGROUND_FIXTURES):
        return 1 if os.environ.get("HPC_ROLLOUT_HEAVY_FIRST") == "1" else 4
    return 2 if group in LONG_MODULES else 3


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks (it appends the group to the node id)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {item.nodeid: group_of(item) for item in items}
    group_rank: dict[str, int] = {}
    for item in items:
        group = groups[item.nodeid]
        group_rank[group] = max(group_rank.get(group, 0), rank_of(item, group))
    first_seen = {group: index for index, group in reversed(list(enumerate(groups[i.nodeid] for i in items)))}
    items.sort(key=lambda item: (group_rank[groups[item.nodeid]], first_seen[groups[item.nodeid]]))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
        if tiers.is_fast(module_of(item, config), function_of(item), getattr(item, "fixturenames", ()),
                         (mark.name for mark in item.iter_markers())):
            item.add_marker(pytest.mark.fast)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(tiers.FAST_TIMEOUT_S))


def module_of(item: pytest.Item, config: pytest.Config) -> str:
    return item.path.relative_to(config.rootpath).as_posix() if item.path.is_relative_to(config.rootpath) else ""


def function_of(item: pytest.Item) -> str:
    return str(getattr(item, "originalname", item.name))


def fast_run(config: pytest.Config) -> bool:
    return bool(config.getoption("markexpr", "") == tiers.TIER_MARK)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `-m fast`, collect the tier's modules alone (the rest takes ~40 s to import)."""
    if not fast_run(config) or not collection_path.is_relative_to(config.rootpath / "tests"):
        return None
    path = collection_path.relative_to(config.rootpath).as_posix()
    if collection_path.is_dir():
        return not any(module.startswith(path + "/") for module in tiers.FAST_MODULES)
    if collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return path not in tiers.FAST_MODULES
    return None


def guarded(item: pytest.Item) -> ContextManager[list[str]]:
    if item.get_closest_marker(tiers.TIER_MARK) is None:
        return nullcontext([])
    return tiers.in_process_only(item.nodeid, module_of(item, item.config), function_of(item))


# Setup and call of a test of the tier run under the guard (teardown not: the last test of a module
# tears down the module's fixtures, which may be another test's worker). A refusal the code under
# test caught still fails the test.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with guarded(item) as refused:
        yield
    if refused:
        raise tiers.NotInProcess(f"{item.nodeid} caught what the fast tier refused: {'; '.join(refused)}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with guarded(item) as refused:
        yield
    if refused:
        raise tiers.NotInProcess(f"{item.nodeid} caught what the fast tier refused: {'; '.join(refused)}")


_tier_times: dict[str, float] = {}
_started = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if tiers.TIER_MARK in report.keywords:
        _tier_times[report.nodeid] = _tier_times.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The tier's size and time; the tests of the tier slower than tiers.SLOW_IN_PROCESS_S, in every run."""
    slow = sorted(((seconds, test) for test, seconds in _tier_times.items() if seconds > tiers.SLOW_IN_PROCESS_S),
                  reverse=True)
    if not (slow or (fast_run(config) and _tier_times)):
        return
    terminalreporter.write_sep("-", "fast tier (tests/tiers.py)")
    if fast_run(config):
        terminalreporter.write_line(
            f"{len(_tier_times)} tests, {sum(_tier_times.values()):.0f} s of test time, "
            f"{time.monotonic() - _started:.0f} s of wall time (the tier's budget: {tiers.BUDGET_S:.0f} s on 2 cores)")
    for seconds, test in slow:
        terminalreporter.write_line(f"{seconds:.1f} s {test}: slower than {tiers.SLOW_IN_PROCESS_S:.0f} s in the "
                                    "pytest process; name it \"slow\" in tests/tiers.py, or make it faster")

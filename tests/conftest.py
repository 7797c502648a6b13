"""Scheduling of the whole suite for parallel runs (scripts/test.sh: `pytest -n 2 --dist loadgroup`).

Every test gets an `xdist_group`, the unit a worker runs whole:
- the Slurm tests share one cluster (and expect its nodes to be theirs): one group, one worker
  (tests/slurm/ and any test marked `slurm`, such as a benchmark launching arrays);
- each benchmark of tests/test_benchmarks.py is a unit of its own (minutes of waiting in all);
- the tests on the session's stock vLLM server: one group, so that one server is started;
- every other test: its module, so that a module-scoped fixture (a server, a finished run) is
  set up once, on one worker.
The order of the units is the order the workers take them: the long, wait-bound Slurm group
first, then the longest modules; the tests of the task image (built in the background by scripts/test.sh), of vLLM and of verl
(installed in the background) last, so that their builds overlap the rest.
Without xdist the marks do nothing but the order applies as well.
"""

from __future__ import annotations

import pytest

SLURM_GROUP = "slurm"
VLLM_SERVER_GROUP = "vllm-server"
BACKGROUND_FIXTURES = ("task_image", "vllm_python", "vllm_server", "mini_swe_agent_venv", "harness_image")
# The longest modules (minutes each, measured with --durations): started early, so that no
# worker is left with one of them at the end while the other idles.
LONG_MODULES = ("tests/trainer/test_closed_loop.py", "tests/report/test_report_run.py", "tests/llm/test_balance.py")


def group_of(item: pytest.Item) -> str:
    path = item.path.as_posix()
    if "/tests/slurm/" in path or item.get_closest_marker("slurm"):
        return SLURM_GROUP
    if path.endswith("/tests/test_benchmarks.py"):
        return item.nodeid   # each benchmark alone: the two workers share them
    if "vllm_server" in getattr(item, "fixturenames", ()):
        return VLLM_SERVER_GROUP
    return item.nodeid.split("::", 1)[0]


def rank_of(item: pytest.Item, group: str) -> int:
    if group == SLURM_GROUP:
        return 0
    fixtures = getattr(item, "fixturenames", ())
    if any(f"/tests/{heavy}/" in item.path.as_posix() for heavy in ("vllm", "verl")) \
            or any(name in fixtures for name in BACKGROUND_FIXTURES):
        return 3
    return 1 if group in LONG_MODULES else 2


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

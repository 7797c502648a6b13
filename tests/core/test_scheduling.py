"""The suite's parallel schedule (tests/conftest.py) as xdist reads it: every group name it gives is
the group xdist's own loadgroup scheduler takes whole to one worker."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from xdist.scheduler.loadgroup import LoadGroupScheduling

from tests import conftest

REPO = Path(__file__).resolve().parents[2]


def item(nodeid: str, **params: Any) -> Any:
    """What group_of reads of a pytest item."""
    return SimpleNamespace(nodeid=nodeid, path=REPO / nodeid.split("::", 1)[0], fixturenames=("tmp_path",),
                           get_closest_marker=lambda name: None, callspec=SimpleNamespace(params=params))


def xdist_group(nodeid: str, group: str) -> str:
    """The unit xdist schedules for a test marked xdist_group(group) (it appends "@group" to the id)."""
    return str(LoadGroupScheduling._split_scope(None, f"{nodeid}@{group}"))   # type: ignore[arg-type]


def test_each_parameter_of_a_parametrized_module_fixture_is_one_unit_of_xdist() -> None:
    """verl's fit() once per trainer: a group name ending in "]" was not read as a group by xdist, so
    every test was its own unit and each worker set both fits up again (6 fits instead of 2 in CI)."""
    units = {}
    for trainer in ("legacy", "v1"):
        for test in ("test_a", "test_b"):
            nodeid = f"tests/verl/test_fit.py::{test}[{trainer}]"
            group = conftest.group_of(item(nodeid, fit=trainer))
            units.setdefault(trainer, set()).add(xdist_group(nodeid, group))
    assert all(len(found) == 1 for found in units.values()), units      # a trainer's tests: one unit
    assert units["legacy"] != units["v1"]                                # the two trainers: two units


def test_a_module_is_one_unit_whatever_its_tests_parameters() -> None:
    ids = ["tests/core/test_x.py::test_a[1]", "tests/core/test_x.py::test_b[x-y]", "tests/core/test_x.py::test_c"]
    assert {xdist_group(n, conftest.group_of(item(n, other=1))) for n in ids} == {"tests/core/test_x.py"}


def test_with_everything_cached_the_tests_of_vllm_verl_and_the_images_go_right_after_slurm(monkeypatch: Any) -> None:
    """On warm caches they fill the CPUs the Slurm group's waiting leaves idle (CI at bd420e7: the CPUs
    40-80% busy for the first 7 minutes, 99% for the last 8, when these ran); cold, they go last,
    after what does not wait for their installs."""
    slurm = item("tests/slurm/test_launch_slurm.py::test_a")
    verl = item("tests/verl/test_fit.py::test_a", fit="v1")
    image = item("tests/proxy/test_agent_clis.py::test_a")
    image.fixturenames = ("tmp_path", "harness_image")
    long, plain = item(f"{conftest.LONG_MODULES[0]}::test_a"), item("tests/core/test_x.py::test_a")

    def order() -> list[Any]:
        ranked = [slurm, verl, image, long, plain]
        return sorted(ranked, key=lambda test: conftest.rank_of(test, conftest.group_of(test)))

    monkeypatch.setenv("HPC_ROLLOUT_HEAVY_FIRST", "1")
    assert order() == [slurm, verl, image, long, plain]
    monkeypatch.setenv("HPC_ROLLOUT_HEAVY_FIRST", "0")
    assert order() == [slurm, long, plain, verl, image]

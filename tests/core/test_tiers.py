"""The fast tier (tests/tiers.py, `python -m pytest -m fast`) is what it says, without timing anything:
every name it lists exists, it covers the spool, tickets, claims, submission and config, nothing in it
needs Slurm, bubblewrap, a server or the tiny model, and its guard refuses what it should."""

from __future__ import annotations

import _posixsubprocess
import ast
import os
import socket
import subprocess
from pathlib import Path

import pytest

from orchestrator.devserver import tiny_model
from tests import tiers

REPO = Path(__file__).resolve().parents[2]
# What an engineer changing the spool runs the tier for: each is imported by a module of the tier.
COVERED = ("orchestrator.spool.fsops", "orchestrator.spool.tickets", "orchestrator.spool.claims",
           "orchestrator.spool.lease", "orchestrator.spool.recovery", "orchestrator.spool.shards",
           "orchestrator.submission.submit", "orchestrator.config")
# Marks (and the skipif marks named after them) of tests that need what the tier runs without.
HEAVY_WORDS = {*tiers.HEAVY_MARKS, "needs_bwrap", "needs_rig"}
# Calls that start a process or load the model, named in a test's own body: none in the tier's tests.
STARTERS = {"start_worker", "Popen", "check_output", "tiny_model_dir", "load_tokenizer", "start_server"}
AT_LEAST = 220   # test functions in the tier (265 when written; ~400 tests with their parameters): losing many is a mistake


def words(nodes: list[ast.AST] | list[ast.expr] | list[ast.stmt]) -> set[str]:
    return {getattr(node, "id", getattr(node, "attr", "")) for root in nodes for node in ast.walk(root)}


def functions_in(module: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse((REPO / module).read_text())
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")}


def module_marks(module: str) -> list[ast.expr]:
    tree = ast.parse((REPO / module).read_text())
    return [node.value for node in tree.body if isinstance(node, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)]


def fast_functions() -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
    """module -> its test functions in the tier, read from the source by tiers.is_fast."""
    tier: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for module in tiers.FAST_MODULES:
        marks = module_marks(module)
        tier[module] = [function for name, function in functions_in(module).items()
                        if tiers.is_fast(module, name, [argument.arg for argument in function.args.args],
                                         words(marks + function.decorator_list))]
    return tier


def test_every_module_and_test_the_tier_names_exists_and_gives_the_tier_a_test() -> None:
    problems = []
    for module, excluded in tiers.FAST_MODULES.items():
        if not (REPO / module).is_file():
            problems.append(f"{module}: no such module")
            continue
        defined = functions_in(module)
        problems += [f"{module}::{name}: no such test" for name in excluded if name not in defined]
        problems += [f"{module}::{name}: {why!r} is none of {sorted(tiers.WHY)}"
                     for name, why in excluded.items() if why not in tiers.WHY]
    problems += [f"{module}: no test of it is in the tier; take it off the list"
                 for module, functions in fast_functions().items() if not functions and (REPO / module).is_file()]
    assert problems == [], "\n".join(problems)


def test_the_tier_covers_the_spool_tickets_claims_submission_and_config() -> None:
    tier = fast_functions()
    count = sum(len(functions) for functions in tier.values())
    assert count >= AT_LEAST, f"the tier has {count} test functions, fewer than {AT_LEAST}"
    imported: dict[str, set[str]] = {}
    for module, functions in tier.items():
        if not functions:
            continue
        for node in ast.walk(ast.parse((REPO / module).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                for name in [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]:
                    imported.setdefault(name, set()).add(module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imported.setdefault(alias.name, set()).add(module)
    assert [name for name in COVERED if not imported.get(name)] == []
    assert {"tests/core/test_config.py", "tests/core/test_submit.py", "tests/core/test_recovery.py",
            "tests/core/test_lease.py", "tests/core/test_atomic_write.py"} <= {m for m, f in tier.items() if f}


def test_nothing_that_needs_slurm_bwrap_a_server_or_the_model_is_in_the_tier() -> None:
    assert [module for module in tiers.FAST_MODULES if module.startswith(tiers.HEAVY_FOLDERS)] == []
    problems = []
    for module, functions in fast_functions().items():
        marks = words(module_marks(module))
        starters = set() if module == "tests/core/test_tiers.py" else STARTERS   # its guard test calls them on purpose
        for function in functions:
            needs = sorted((marks | words(function.decorator_list)) & HEAVY_WORDS
                           | {argument.arg for argument in function.args.args} & set(tiers.HEAVY_FIXTURES)
                           | words(function.body) & starters)
            if needs:
                problems.append(f"{module}::{function.name}: {needs}")
    assert problems == [], "\n".join(problems)
    # the rule refuses those whatever the list says
    listed = "tests/core/test_config.py"
    some = next(iter(functions_in(listed)))
    assert tiers.is_fast(listed, some)
    assert not tiers.is_fast(listed, some, fixtures=["vllm_server"])
    assert not tiers.is_fast(listed, some, marks=["slurm"])
    assert not tiers.is_fast("tests/slurm/test_launch_slurm.py", some)
    assert not tiers.is_fast("tests/core/test_crash.py", "test_sigkill_mid_run_every_job_ends_exactly_once")


def test_the_guard_refuses_a_program_a_server_the_network_and_the_model_but_not_a_fork() -> None:
    before = (_posixsubprocess.fork_exec, os.system, socket.socket.listen, tiny_model.cached_model)
    with tiers.in_process_only("this test", "tests/core/test_tiers.py", "test_x") as refused:
        with pytest.raises(tiers.NotInProcess, match=r"runs a program \(true\)\. If it must, add \"test_x\""):
            subprocess.run(["true"])
        with pytest.raises(tiers.NotInProcess, match="runs a program"):
            os.system("true")
        with socket.socket() as server, pytest.raises(tiers.NotInProcess, match="listens on a socket"):
            server.bind(("127.0.0.1", 0))
            server.listen()
        with socket.socket() as client, pytest.raises(tiers.NotInProcess, match="the network"):
            client.connect(("192.0.2.1", 9))   # TEST-NET-1: refused before anything is sent
        with socket.socket() as client:
            assert client.connect_ex(("127.0.0.1", 9)) != 0   # loopback is allowed (nothing listens there)
        with pytest.raises(tiers.NotInProcess, match="tiny model"):
            tiny_model.tiny_model_dir()
        child = os.fork()
        if child == 0:
            os._exit(7)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 7
    assert len(refused) == 5
    assert (_posixsubprocess.fork_exec, os.system, socket.socket.listen, tiny_model.cached_model) == before


def test_this_sessions_tests_are_marked_by_the_rule(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker(tiers.TIER_MARK) is not None   # this module is in the tier
    wrong = []
    for item in request.session.items:
        module = item.path.relative_to(REPO).as_posix()
        name = getattr(item, "originalname", item.name)
        marked = item.get_closest_marker(tiers.TIER_MARK) is not None
        timeout = item.get_closest_marker("timeout")
        listed = module in tiers.FAST_MODULES and name not in tiers.FAST_MODULES[module]
        if marked and not (listed and timeout is not None and timeout.args[0] <= tiers.FAST_TIMEOUT_S):
            wrong.append(f"{item.nodeid}: marked fast")
        if not marked and listed \
                and not {mark.name for mark in item.iter_markers()} & set(tiers.HEAVY_MARKS) \
                and not set(getattr(item, "fixturenames", ())) & set(tiers.HEAVY_FIXTURES):
            wrong.append(f"{item.nodeid}: not marked fast")
    assert wrong == [], "\n".join(wrong)

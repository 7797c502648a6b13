"""The worker's memory is owned like tickets are (issue 38, item 2): the jobs it carries
(`HeldJobs`) and its pools' slots (`StagePools`, `Slot`) change only through their own methods in
orchestrator/worker/state.py, one per move. Anywhere else in the package, writing a held-job
field, taking or giving back a slot by hand, or changing a busy count fails this test with the
line to change.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from orchestrator.spool.jobs import Stage
from orchestrator.worker.state import HeldJobs, StagePools

REPO = Path(__file__).resolve().parents[2]
OWNER = REPO / "orchestrator" / "worker" / "state.py"
HELD_FIELDS = {"running", "in_flight", "user_cancelled", "prepared", "waiting_init", "waiting_eval", "written"}
MUTATORS = {"pop", "popitem", "add", "discard", "clear", "update", "setdefault", "remove", "__setitem__", "__delitem__"}
POOL_INSIDES = {"_slots", "_busy"}


def _held_field(node: ast.AST) -> bool:
    """`jobs.F` or `<anything>.jobs.F` with F a field of HeldJobs."""
    if not (isinstance(node, ast.Attribute) and node.attr in HELD_FIELDS):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "jobs") or (isinstance(owner, ast.Attribute) and owner.attr == "jobs")


def _pools(node: ast.AST) -> bool:
    """`pools` or `<anything>.pools`."""
    return (isinstance(node, ast.Name) and node.id == "pools") or (isinstance(node, ast.Attribute) and node.attr == "pools")


def _written(target: ast.AST) -> ast.AST:
    """What an assignment or del target changes: the container of `x[k]`, else `x` itself."""
    return target.value if isinstance(target, ast.Subscript) else target


def violations(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = [t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if _held_field(_written(target)):
                found.append(f"{line}: writes a HeldJobs field: use its methods (worker/state.py)")
        if isinstance(node, ast.Assign) and _held_field(node.value) \
                and any(isinstance(t, ast.Name) for t in node.targets):
            found.append(f"{line}: keeps a HeldJobs field under another name: use its methods (worker/state.py)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and _held_field(node.func.value):
            found.append(f"{line}: changes a HeldJobs field with .{node.func.attr}(): use its methods (worker/state.py)")
        if isinstance(node, ast.Attribute) and node.attr in POOL_INSIDES | {"slots"} and _pools(node.value):
            found.append(f"{line}: reaches into the pools ({node.attr}): take a Slot with StagePools.take / take_if_free")
    return found


def test_only_worker_state_changes_the_workers_memory() -> None:
    found = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        if path != OWNER:
            found += violations(path.read_text(), str(path.relative_to(REPO)))
    assert found == [], "\n".join(found)


def test_the_check_catches_each_way_of_writing_the_memory_by_hand() -> None:
    hand_written = '''
state.jobs.prepared[name] = ticket
del jobs.waiting_eval[name]
jobs.user_cancelled.add(name)
ticket = self.state.jobs.written.pop(name, None)
waiting, state.jobs.waiting_init = state.jobs.waiting_init, {}
written = self.state.jobs.written
state.pools._slots[stage].release()
await state.pools.slots[stage].acquire()
state.pools._busy[stage] += 1
'''
    found = violations(hand_written, "example.py")
    assert sorted({int(entry.split(":")[1]) for entry in found}) == list(range(2, 11)), found
    owned = '''
state.jobs.keep_prepared(ticket)
ticket = jobs.take_waiting_eval(name)
if name in jobs.prepared and jobs.running.get(name):
    pass
slot = await state.pools.take(stage)
slot.give_back()
'''
    assert violations(owned, "example.py") == []


def test_a_slot_is_given_back_once_and_pools_count_busy_stages() -> None:
    async def scenario() -> None:
        pools = StagePools.of_sizes({Stage.INIT: 1, Stage.RUN: 2, Stage.EVAL: 1})
        first = await pools.take(Stage.RUN)
        second = await pools.take_if_free(Stage.RUN)
        assert second is not None and await pools.take_if_free(Stage.RUN) is None
        first.give_back()
        first.give_back()   # a second give-back must not mint a slot
        third = await pools.take_if_free(Stage.RUN)
        assert third is not None and await pools.take_if_free(Stage.RUN) is None
        pools.stage_started(Stage.EVAL)
        assert pools.busy(Stage.EVAL) == 1
        pools.stage_ended(Stage.EVAL)
        assert pools.busy(Stage.EVAL) == 0

    asyncio.run(scenario())


def test_a_stage_handed_on_is_not_forgotten_when_its_first_task_ends() -> None:
    async def scenario() -> None:
        jobs = HeldJobs()
        first = asyncio.create_task(asyncio.sleep(0))
        second = asyncio.create_task(asyncio.sleep(0))
        jobs.task_started("j", first, Stage.INIT)
        jobs.task_started("j", second, Stage.RUN)   # INIT handed the job to RUN here
        jobs.task_ended("j", first)
        assert jobs.running["j"] == (second, Stage.RUN)
        jobs.task_ended("j", second)
        assert not jobs.holding()
        await asyncio.gather(first, second)

    asyncio.run(scenario())

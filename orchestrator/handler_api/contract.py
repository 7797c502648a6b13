"""The AgentHandler contract: what a task family implements, and how handlers are found.

A handler is registered by name in the entry point group `hpc_rollout.handlers`, so a
user's own package can add one without touching this repository:

    [project.entry-points."hpc_rollout.handlers"]
    my_task = "my_package.handler:MyHandler"

Stages, in order, each on a fresh `JobContext` (INIT and RUN on the same node, EVAL anywhere):

    prepared = await handler.init(ctx)             # start the sandbox, set the task up
    result   = await handler.run(ctx, prepared)    # the agent loop; the runtime is closed right after
    scored   = await handler.eval(ctx, result)     # the reward, from artifacts only

Each stage returns a JSON-serialisable dict that travels to the next stage inside the job's
ticket. When a stage raises, the matching `*_exception` hook turns the error into that stage's
output, and the job goes straight to its row. `final_result` always builds a well-formed row.
"""

from __future__ import annotations

import abc
import difflib
import math
import time
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema
from orchestrator.errors import HpcRolloutError
from orchestrator.resource_class import ResourceClass
from orchestrator.spool.jobs import StageError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoints

    from orchestrator.handler_api.context import JobContext

ENTRY_POINT_GROUP = "hpc_rollout.handlers"

class HandlerError(HpcRolloutError):
    """A handler cannot be found or loaded."""


STAGE_ORDER = ("init", "run", "eval")


def merge_stage_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    """The stages' outputs as one dict, later stages winning on shared keys."""
    merged: dict[str, Any] = {}
    for stage in STAGE_ORDER:
        merged.update(outputs.get(stage) or {})
    return merged


class AgentHandler(abc.ABC):
    """Base class of every task family. Subclasses set `name` and implement the three stages."""

    name: ClassVar[str] = ""
    # The keys its instances take (handler_api/schema.py); None: not checked at submit, beyond
    # validate_instance (third-party handlers written before schemas existed keep working).
    instance_schema: ClassVar[InstanceSchema | None] = None
    # What its reward is (handler_api/reward_rule.py): `hpc-rollout handlers NAME` prints it, and
    # `submit` refuses rows whose reward_model it would ignore. None: not declared (not checked).
    reward_rule: ClassVar[RewardRule | None] = None
    # What one of its jobs holds on a node (sandbox memory, CPUs, expected duration), where the run
    # admits jobs by class (orchestrator/resource_class.py); run.toml [classes.NAME] of the same name,
    # or listing the handler, wins. None: the run's default class.
    resource_class: ClassVar[ResourceClass | None] = None

    def ignored_reward_model(self, instance: dict[str, Any]) -> str | None:
        """Why this row's `reward_model` would play no part in its reward (None: it does, or the row
        has none, or the handler declares no rule)."""
        rule = self.reward_rule
        if rule is None or rule.ground_truth is not None or instance.get("reward_model") is None:
            return None
        return f"{self.name} does not use reward_model (its reward: {rule.summary})"

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Raise ValueError naming the problem when `instance` cannot run. Called at submit time,
        after the instance schema's check (see `check_instance`)."""

    def sandbox_request(self, instance: dict[str, Any]) -> dict[str, Any]:
        """The sandbox options a job of this row will ask `ctx.open_sandbox` for, beyond the run's
        defaults (image, network, binds, limits...): `submit` refuses the row when the run's policy
        (run.toml [sandbox], orchestrator/sandbox/policy.py) does not allow them, and a worker checks
        again before INIT. Whatever a handler really asks for is checked when it opens a sandbox."""
        return {}

    def code_scorer(self, instance: dict[str, Any]) -> str | None:
        """What of this row's grading may run the model's output as code (it then runs in a scorer
        sandbox), named for an error; None: nothing does. `submit` refuses such a row when the run
        has no sandbox (run.toml [sandbox] runtime = "local"), instead of letting it fail at EVAL."""
        return None

    @abc.abstractmethod
    async def init(self, ctx: "JobContext") -> dict[str, Any]:
        """Prepare the job (start its sandbox through `ctx.open_sandbox`) and return its state."""

    @abc.abstractmethod
    async def run(self, ctx: "JobContext", prepared: dict[str, Any]) -> dict[str, Any]:
        """Run the agent; return the trajectory (see orchestrator.spool.rows.TRAJECTORY_KEYS) and anything EVAL needs."""

    @abc.abstractmethod
    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        """Score `result`; return at least {"reward": float}."""

    def init_exception(self, ctx: "JobContext", error: StageError) -> dict[str, Any]:
        return {"error": error.as_text()}

    def run_exception(self, ctx: "JobContext", error: StageError) -> dict[str, Any]:
        return {"error": error.as_text()}

    def eval_exception(self, ctx: "JobContext", error: StageError) -> dict[str, Any]:
        return {"error": error.as_text(), "reward": None}

    def final_result(
        self, ctx: "JobContext", outputs: dict[str, dict[str, Any]], error: StageError | None
    ) -> dict[str, Any]:
        """Merge stage outputs into the row's trajectory fields; never raises.

        `outputs` maps stage name to that stage's output. Later stages win on shared keys;
        keys outside orchestrator.spool.rows.TRAJECTORY_KEYS end up in the row's `result` JSON column.
        """
        merged = merge_stage_outputs(outputs)
        reward = merged.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            merged["reward"] = None
        return merged


def check_instance(handler: AgentHandler, instance: dict[str, Any]) -> None:
    """What `submit` and `tasks check` ask of every row: its keys and types against the handler's
    schema (when it has one), then the handler's own `validate_instance`. ValueError names the problem."""
    if handler.instance_schema is not None:
        handler.instance_schema.check(instance, handler.name)
    handler.validate_instance(instance)


def ground_truth_handlers(instance: dict[str, Any], exclude: str = "") -> list[str]:
    """The installed handlers that grade against this row's reward_model and accept the row as it is."""
    found = []
    for name in sorted(available_handlers(max_age_s=LISTING_REUSE_S)):
        if name == exclude:
            continue
        try:
            handler = load_handler(name)
            if handler.reward_rule is None or handler.reward_rule.ground_truth is None:
                continue
            check_instance(handler, instance)
        except Exception:   # a handler that cannot load or refuses the row is no candidate
            continue
        if handler.ignored_reward_model(instance) is None:
            found.append(name)
    return found


# load_handler reuses a scan of the installed entry points this long (seconds): submit looks up a
# verl row's data_source as a handler first, at every call of a trainer's step, and a scan reads
# every installed distribution's metadata (10-15 ms a call in verl's environment). A handler
# installed meanwhile is found once the scan is this old.
LISTING_REUSE_S = 10.0
_listing: tuple[float, dict[str, Any]] | None = None   # (when scanned, monotonic; entry points by name)


def entry_points(*, group: str) -> EntryPoints:
    """importlib.metadata.entry_points, imported at the first scan: it brings email, socket and
    csv (~45 ms), which `hpc-rollout --help` and `status` never need."""
    from importlib.metadata import entry_points as scan

    return scan(group=group)


def available_handlers(max_age_s: float = 0.0) -> dict[str, Any]:
    """Entry points of every installed handler, by name (a scan at most `max_age_s` old)."""
    global _listing
    now = time.monotonic()
    if _listing is None or now - _listing[0] > max_age_s:
        _listing = (now, {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)})
    return _listing[1]


_loaded: dict[str, type[AgentHandler]] = {}


def load_handler(name: str) -> AgentHandler:
    """A fresh handler instance for `name`, or HandlerError listing the installed ones."""
    cls = _loaded.get(name)
    if cls is None:
        found = available_handlers(max_age_s=LISTING_REUSE_S)
        if name not in found:
            known = ", ".join(sorted(found)) or "none"
            close = difflib.get_close_matches(name, sorted(found), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise HandlerError(
                f"unknown handler {name!r}{hint}; installed handlers: {known} (`hpc-rollout handlers` lists them). "
                f"A package adds one through the entry point group {ENTRY_POINT_GROUP!r}."
            )
        try:
            cls = found[name].load()
        except Exception as exc:  # a broken plugin must not look like a missing one
            raise HandlerError(f"handler {name!r} failed to import: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, AgentHandler)):
            raise HandlerError(f"handler {name!r} is {cls!r}, not an AgentHandler subclass")
        _loaded[name] = cls
    return cls()

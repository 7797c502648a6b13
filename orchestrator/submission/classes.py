"""The resource class of each submitted job, where the run declares classes (run.toml [node],
[classes.NAME]; orchestrator/resource_class.py).

A job's class is, in order: the class `submit --class NAME` names; the run.toml class listing its
handler; the handler's own `resource_class` (run.toml's class of that name wins); else the run's
`default` class (run.toml [classes.default], or the run's sandbox memory, [sandbox] total_memory_mb).
A class no worker of the run could ever start refuses the row here, naming the fix, rather than
leaving a job queued for ever.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import RunConfig
from orchestrator.errors import HpcRolloutError
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.resource_class import DEFAULT_CLASS, ResourceClass, never_fits


class UnknownClass(HpcRolloutError, ValueError):
    """`--class NAME` names no class the run declares (the submit wraps it in SubmitError)."""


@dataclass(frozen=True)
class ClassChoice:
    config: RunConfig
    explicit: str | None = None   # submit --class

    @classmethod
    def of(cls, config: RunConfig, explicit: str | None) -> "ClassChoice":
        if explicit and explicit not in config.classes:
            declared = ", ".join(sorted(config.classes)) or "none"
            raise UnknownClass(f"--class {explicit!r} is not a class of this run (declared: {declared}); declare it "
                               f"in run.toml, e.g. [classes.{explicit}] memory_mb = 2048, or name a declared one")
        return cls(config, explicit)

    def resolve(self, handler_name: str, handler: AgentHandler) -> ResourceClass | None:
        """The job's class; None where the run declares none (its tickets carry no class). ValueError
        when its class could never start on a node of the run."""
        config = self.config
        if not config.classes_in_force:
            return None
        chosen = self._chosen(handler_name, handler)
        refusal = never_fits(chosen, config.node.memory_mb, config.node.cpus)
        if refusal and chosen.name == DEFAULT_CLASS and DEFAULT_CLASS not in config.classes:
            refusal = (f"handler {handler_name!r} has no resource class, and the default ([sandbox] total_memory_mb "
                       f"= {chosen.memory_mb} MB) exceeds the node's budget of {config.node.memory_mb} MB "
                       f"([node] memory_mb): list it in a class (run.toml [classes.NAME] handlers = [\"{handler_name}\"]), "
                       f"submit with --class NAME, or declare [classes.{DEFAULT_CLASS}] memory_mb")
        if refusal:
            raise ValueError(refusal)
        return chosen

    def _chosen(self, handler_name: str, handler: AgentHandler) -> ResourceClass:
        classes = self.config.classes
        if self.explicit:
            return classes[self.explicit]
        for declared in classes.values():
            if handler_name in declared.handlers:
                return declared
        own = handler.resource_class
        if own is not None:
            return classes.get(own.name, own)
        return classes.get(DEFAULT_CLASS) or ResourceClass(DEFAULT_CLASS, memory_mb=self.config.sandbox.total_memory_mb)

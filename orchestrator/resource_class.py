"""Resource classes: what one job of a class holds on its node while its sandbox is up.

A class is declared in run.toml (or by a handler, `AgentHandler.resource_class`), next to the
node's budget that workers admit jobs against (orchestrator/worker/admission.py says the rule):

    [node]
    memory_mb = 65536          # sandbox memory one worker may have in use at once (0: not counted)
    cpus = 32                  # sandbox CPUs likewise (0: not counted)

    [classes.swe]
    memory_mb = 16384          # what one job's sandbox holds, from its INIT to the end of its RUN
    cpus = 4
    expected_s = 600           # how long a job runs, for the reader (and `status`)
    weight = 1                 # its share when classes compete for slots
    max_jobs = 0               # at most this many of its jobs per worker at once (0: no limit)
    handlers = ["swe"]         # jobs of these handlers are of this class unless `submit --class` says otherwise

A job carries its class (the figures, not only the name) from `submit` on, in its ticket.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from orchestrator.settings_spec import Family, Numbers, checked, setting

DEFAULT_CLASS = "default"   # the class of a job that names none, where classes are in force


@dataclass(frozen=True)
class ResourceClass:
    name: str   # its table's name, [classes.NAME]: not a setting
    memory_mb: int = setting(1024, "MB of sandbox memory one job holds, from its INIT to the end of its RUN",
                             bounds=(1, 1 << 22))
    cpus: int = setting(1, "sandbox CPUs one job holds", bounds=(0, 4096))
    expected_s: float = setting(60.0, "how long a job runs, for the reader (and `status`)", bounds=(0, 7 * 86400))
    weight: float = setting(1.0, "its share when classes compete for slots", bounds=(0.01, 1000))
    max_jobs: int = setting(0, "at most this many of its jobs per worker at once (0: no limit)", bounds=(0, 65536))
    # Checked by parse_class: a list of handler names.
    handlers: tuple[str, ...] = setting((), "jobs of these handlers are of this class unless `submit --class` says "
                                            "otherwise", kind=object)

    def to_json(self) -> dict[str, Any]:
        """What a job carries in its ticket (the handlers it covers stay in run.toml)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "handlers"}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ResourceClass":
        """The class a ticket carries; ValueError when it is malformed."""
        name = data.get("name")
        return parse_class(name if isinstance(name, str) else "", {k: v for k, v in data.items() if k != "name"})

    def summary(self) -> str:
        return f"{self.name} ({self.memory_mb} MB, {self.cpus} CPU(s), ~{self.expected_s:g} s)"


def parse_class(name: str, values: dict[str, Any], where: str = "classes") -> ResourceClass:
    """One class from its table; ValueError naming the key and the valid range or keys."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"{where}: class name {name!r} must be letters, digits, '_' or '-', e.g. [classes.swe]")
    # A figure: an int or float, never a bool; a whole number's without a fraction (what run.toml always took).
    family = Family("key", f"{where}.{name}.{{key}}", scope=f"{where}.{name}", numbers=Numbers.WHOLE,
                    out_of_range="{name} = {value} is outside {interval}", not_a_number="{name} must be {kind}, got {value!r}")
    figures = checked(ResourceClass, values, family)
    if "handlers" in figures:
        handlers = figures["handlers"]
        if not isinstance(handlers, (list, tuple)) or not all(isinstance(h, str) and h for h in handlers):
            raise ValueError(f"{where}.{name}.handlers must be a list of handler names, got {handlers!r}")
        figures["handlers"] = tuple(handlers)
    return ResourceClass(name, **figures)


def never_fits(job_class: ResourceClass, memory_mb: int, cpus: int) -> str | None:
    """Why no job of `job_class` can ever start on a node with this budget (0: not counted); None: it can."""
    if memory_mb and job_class.memory_mb > memory_mb:
        return (f"class {job_class.name!r} needs {job_class.memory_mb} MB of sandbox memory per job, more than "
                f"the node's whole budget of {memory_mb} MB (run.toml [node] memory_mb): raise [node] memory_mb "
                f"or lower [classes.{job_class.name}] memory_mb")
    if cpus and job_class.cpus > cpus:
        return (f"class {job_class.name!r} needs {job_class.cpus} CPUs per job, more than the node's {cpus} "
                f"(run.toml [node] cpus): raise [node] cpus or lower [classes.{job_class.name}] cpus")
    return None

"""Which handler a verl row goes to, and why: said once per data_source.

The rule is submit's (orchestrator/submission/submit.py, `parse_task` and its fallback), in order:
the data_source mapped by hpc_rollout.source_handlers, then by run.toml [data_sources]; a handler
named like the data_source; hpc_rollout.handler. The third step surprises: rows whose data_source
is `math` go to the `math` handler whatever hpc_rollout.handler says. tests/trainer/test_verl_routing.py
checks this explanation against the handler submit actually chooses.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from orchestrator.handler_api.contract import LISTING_REUSE_S, available_handlers

PREFIX = "hpc-rollout: "


@dataclass(frozen=True)
class Route:
    data_source: str
    handler: str | None     # None: submit refuses the row (and says how to map it)
    why: str

    def line(self) -> str:
        target = f"handler {self.handler!r}" if self.handler else "no handler"
        return f"data_source {self.data_source!r} -> {target} ({self.why})"


def route(data_source: str, source_handlers: Mapping[str, str], run_sources: Mapping[str, str],
          handler_names: Collection[str], default: str | None) -> Route:
    if data_source in source_handlers:
        over = run_sources.get(data_source)
        shadowed = f", over run.toml's {over!r}" if over and over != source_handlers[data_source] else ""
        return Route(data_source, source_handlers[data_source], f"hpc_rollout.source_handlers{shadowed}")
    if data_source in run_sources:
        return Route(data_source, run_sources[data_source], "run.toml [data_sources]")
    if data_source in handler_names:
        before = f", before hpc_rollout.handler {default!r}" if default and default != data_source else ""
        return Route(data_source, data_source, f"a handler of that name{before}; to change it: "
                                               f"+hpc_rollout.source_handlers={{{data_source}: HANDLER}}")
    if default:
        return Route(data_source, default, "hpc_rollout.handler: no mapping, no handler of that name")
    return Route(data_source, None, "no mapping, no handler of that name and no hpc_rollout.handler: "
                                    f"+hpc_rollout.source_handlers={{{data_source}: HANDLER}}")


class RouteLog:
    """Logs each data_source's route the first time a batch carries it."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.seen: set[str] = set()

    def note(self, data_sources: Iterable[object], source_handlers: Mapping[str, str],
             run_sources: Mapping[str, str], default: str | None) -> list[Route]:
        new = [s for s in dict.fromkeys(str(s) for s in data_sources if s is not None) if s not in self.seen]
        if not new:
            return []
        names = set(available_handlers(max_age_s=LISTING_REUSE_S))   # submit's own listing (reused for 10 s)
        routes = [route(source, source_handlers, run_sources, names, default) for source in new]
        for found in routes:
            self.logger.info("%s%s", PREFIX, found.line())
        self.seen.update(new)
        return routes

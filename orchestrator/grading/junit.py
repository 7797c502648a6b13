"""pytest's JUnit XML report -> {node id: status}, and SWE-bench's "resolved" rule.

pytest writes the report with `--junitxml=FILE -o junit_family=xunit1` (xunit1 keeps the
`file` attribute, from which the node id `path/test_x.py::Class::test_name[param]` is rebuilt).
A maintained structured format instead of scraping the console log.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from typing import Any

PASSED, FAILED, SKIPPED, ERROR = "PASSED", "FAILED", "SKIPPED", "ERROR"


def node_id(case: ElementTree.Element) -> str:
    name = case.get("name", "")
    classname = case.get("classname", "")
    path = case.get("file", "")
    if not path:   # xunit2: no file; classname is module.path.Class
        return f"{classname.replace('.', '/')}.py::{name}" if classname else name
    module = path[:-3].replace("/", ".") if path.endswith(".py") else path.replace("/", ".")
    classes = classname[len(module):].lstrip(".") if classname.startswith(module) else ""
    return "::".join([path] + ([*classes.split(".")] if classes else []) + [name])


def statuses(xml_text: str) -> dict[str, str]:
    """Node id -> PASSED | FAILED | SKIPPED | ERROR for every test case in the report."""
    root = ElementTree.fromstring(xml_text)
    found: dict[str, str] = {}
    for case in root.iter("testcase"):
        children = {child.tag for child in case}
        status = (ERROR if "error" in children else FAILED if "failure" in children
                  else SKIPPED if "skipped" in children else PASSED)
        found[node_id(case)] = status
    return found


@dataclass(frozen=True)
class Resolution:
    fail_to_pass: dict[str, str]
    pass_to_pass: dict[str, str]

    @property
    def resolved(self) -> bool:
        """SWE-bench's RESOLVED_FULL: every FAIL_TO_PASS and PASS_TO_PASS test passes."""
        return all(s == PASSED for s in (*self.fail_to_pass.values(), *self.pass_to_pass.values()))

    def to_json(self) -> dict[str, Any]:
        def count(group: dict[str, str]) -> dict[str, int]:
            return {"passed": sum(s == PASSED for s in group.values()), "total": len(group)}

        return {"resolved": self.resolved, "fail_to_pass": count(self.fail_to_pass),
                "pass_to_pass": count(self.pass_to_pass),
                "failing": sorted(t for g in (self.fail_to_pass, self.pass_to_pass)
                                  for t, s in g.items() if s != PASSED)[:50]}


def resolution(found: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]) -> Resolution:
    """A test missing from the report (did not run, not collected) counts as failed."""
    return Resolution({t: found.get(t, "MISSING") for t in fail_to_pass},
                      {t: found.get(t, "MISSING") for t in pass_to_pass})

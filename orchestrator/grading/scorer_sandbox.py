"""One reward function call in a sandbox of its own: for scorers that execute the model's output.

verl's code scorers run the reply as a program, its math scorers hand it to eval() and sympy's
parse_expr, and an operator's custom function may do anything: none of that runs on the worker.
Each call gets a fresh sandbox of the worker's runtime, chosen here by the engine (never by a row):

- no network, no writable host path: /workspace and /tmp are the sandbox's own tmpfs (bubblewrap;
  Apptainer binds a fresh directory of the job's, removed right after);
- the host's /usr read-only, as in every bubblewrap sandbox without an image (Apptainer: the
  run's image), plus the worker's Python installation read-only at its own paths: its prefixes
  (a venv's and its base interpreter's) and the import root of each package the call names that
  lives elsewhere. A root that would show the home directory, the run directory or `/` is refused;
- the call (function, keyword arguments) goes in as a JSON file, the operator's reward file is
  uploaded as text, scorer_runner.py runs the call with the worker's interpreter and writes the
  result as JSON; the sandbox is closed (and verified gone) before the result is used.

The `local` runtime has no sandbox: a call is refused there, naming the fix.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import Runtime
from orchestrator.errors import HpcRolloutError

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

RUNNER = Path(__file__).with_name("scorer_runner.py")
INSIDE = ".scorer"                 # under /workspace
CALL_TIMEOUT_S = 300.0             # prime_code: up to 11 test runs of 10 s each, plus imports
MAX_RESULT_BYTES = 1 << 20
RUN_LIMITS = ("total_memory_mb", "workspace_mb", "processes")   # the run's totals hold here too


class ScorerSandboxError(HpcRolloutError, ValueError):
    """A reward function call that cannot run sandboxed, or failed there; the message says why and how to fix it."""


@dataclass(frozen=True)
class ScorerCall:
    """One call: `function` of an installed `module`, or of the operator's file (given as its text)."""

    function: str
    kwargs: dict[str, Any]
    module: str = ""
    file_text: str = ""
    light_parents: tuple[str, ...] = ()           # packages whose __init__ the runner skips (scorer_runner.py)
    packages: tuple[str, ...] = ()                # top-level packages the call needs from the worker's Python

    def describe(self) -> str:
        return f"{self.module}.{self.function}" if self.module else f"the operator's {self.function}"


def refuse_local(runtime: str, what: str) -> None:
    """ScorerSandboxError when `runtime` has no sandbox to run `what` in."""
    if runtime == Runtime.LOCAL.value:
        raise ScorerSandboxError(
            f"{what} may run the model's output as code, and the workers use the `local` runtime, which has no "
            f"sandbox: run them with bubblewrap or Apptainer (run.toml [sandbox] runtime = \"auto\" or \"bwrap\", "
            f"and `hpc-rollout launch` without --runtime local), or score with the handler's own reward")


def python_roots(packages: tuple[str, ...], private: tuple[Path, ...]) -> list[tuple[Path, Path]]:
    """(host source, path inside) of each directory of the worker's Python a call needs, read-only.

    `private`: directories no root may contain (the home directory, the run directory).
    """
    import importlib.util

    wanted = [Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)]
    for package in packages:
        found = importlib.util.find_spec(package)   # a top-level name: found, not imported
        if found is None:
            raise ScorerSandboxError(f"the reward function needs the package {package!r}, which this worker's Python "
                                     f"({sys.executable}) does not have: install it there")
        locations = list(found.submodule_search_locations or [])
        wanted.append(Path(locations[0]).parent if locations else Path(str(found.origin)).parent)
    chosen: list[Path] = []
    for root in sorted({Path(os.path.abspath(p)) for p in wanted}, key=lambda p: len(p.parts)):
        if not any(root == c or c in root.parents for c in chosen):
            chosen.append(root)
    for root in chosen:
        real = Path(os.path.realpath(root))
        shown = [p for p in private if p.is_relative_to(root) or p.is_relative_to(real)]
        if real == Path("/") or shown:
            raise ScorerSandboxError(
                f"the worker's Python installation lies in {root}, which holds {shown[0] if shown else 'everything'}: "
                f"binding it into the scorer sandbox would show that to the model's code; run the workers from a "
                f"virtualenv or conda environment of its own (e.g. python -m venv /opt/rollout-env)")
    bound = [(Path(os.path.realpath(root)), root) for root in chosen]
    interpreter = Path(os.path.abspath(sys.executable))
    if not (any(interpreter.is_relative_to(target) for _, target in bound)
            and any(Path(os.path.realpath(interpreter)).is_relative_to(source) for source, _ in bound)):
        raise ScorerSandboxError(f"the worker's interpreter {interpreter} lies outside its own prefixes "
                                 f"({', '.join(map(str, chosen))}): run the workers with a regular Python "
                                 f"installation or virtualenv")
    return bound


def sandbox_options(ctx: "JobContext", runtime: str, roots: list[tuple[Path, Path]],
                    workspace: Path | None) -> dict[str, Any]:
    """What the scorer sandbox starts with: the engine's choice, not a row's (no policy is asked)."""
    run_limits = ctx.services.sandbox_defaults.get("limits") or {}
    options: dict[str, Any] = {
        "network": False, "fakeroot": False, "keep_workspace": False, "cgroup": True,
        "binds": [{"source": str(source), "target": str(target), "read_only": True} for source, target in roots],
        "limits": {**{k: v for k, v in run_limits.items() if k in RUN_LIMITS},
                   "wall_clock_s": CALL_TIMEOUT_S + 60, "command_timeout_s": CALL_TIMEOUT_S},
    }
    if runtime == Runtime.APPTAINER.value and ctx.services.sandbox_defaults.get("image"):
        options["image"] = ctx.services.sandbox_defaults["image"]   # apptainer needs one; bubblewrap: host /usr
    if workspace is not None:
        options["workspace"] = str(workspace)
    return options


async def run_sandboxed(ctx: "JobContext", call: ScorerCall) -> Any:
    """The return value of `call`, run in a fresh scorer sandbox (ScorerSandboxError if it fails there)."""
    from orchestrator.sandbox.start import RUNTIME_CLASSES, resolve_runtime, start_sandbox

    refuse_local(ctx.services.runtime, call.describe())
    runtime = resolve_runtime(ctx.services.runtime)
    private = tuple(Path(os.path.realpath(p)) for p in (Path.home(), ctx.paths.root))
    roots = python_roots(call.packages, private)
    workspace = None
    if not RUNTIME_CLASSES[Runtime(runtime)].mounts_tmpfs_workspace:
        workspace = ctx.artifact_dir() / f"scorer-{ctx.attempt}-{secrets.token_hex(3)}"
    options = sandbox_options(ctx, runtime, roots, workspace)
    payload = {"function": call.function, "kwargs": call.kwargs, "module": call.module,
               "light_parents": list(call.light_parents), **({"file": f"{INSIDE}/reward.py"} if call.file_text else {})}
    started = time.monotonic()
    try:
        sandbox = await start_sandbox(runtime, job_id=ctx.job.job_id, paths=ctx.paths, **options)
        try:
            await sandbox.upload(RUNNER, f"{INSIDE}/runner.py")
            await sandbox.upload(json.dumps(payload).encode(), f"{INSIDE}/call.json")
            if call.file_text:
                await sandbox.upload(call.file_text.encode(), f"{INSIDE}/reward.py")
            command = (f"{shlex.quote(sys.executable)} -I -B {INSIDE}/runner.py {INSIDE}/call.json "
                       f"{INSIDE}/result.json")
            ran = await sandbox.bash(command, timeout=CALL_TIMEOUT_S)
            fetched = await sandbox.download(f"{INSIDE}/result.json")
        finally:
            await sandbox.close()
    finally:
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)
    ctx.event("scorer_sandboxed", scorer=call.describe(), ms=round((time.monotonic() - started) * 1000))
    if fetched.error or fetched.content is None:
        why = "timed out" if ran.timed_out else f"exit {ran.exit_code}"
        raise ScorerSandboxError(f"{call.describe()} failed in its sandbox ({why}): {ran.output[-1000:]}")
    if len(fetched.content) > MAX_RESULT_BYTES:
        raise ScorerSandboxError(f"{call.describe()} returned {len(fetched.content)} bytes; at most {MAX_RESULT_BYTES}")
    try:
        reply = json.loads(fetched.content)
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or not ("result" in reply or "error" in reply):
        raise ScorerSandboxError(f"{call.describe()} left no readable result in its sandbox: {fetched.content[:200]!r}")
    if "error" in reply:
        raise ScorerSandboxError(f"{call.describe()} failed in its sandbox: {reply['error']}\n{reply.get('traceback', '')}")
    return reply["result"]

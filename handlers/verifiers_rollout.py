"""One verifiers v1 rollout, run INSIDE the job's sandbox by the python of a venv with verifiers
(the `verifiers` handler uploads this file there; it never runs in the worker).

    python verifiers_rollout.py SPEC.json REPORT.json

SPEC: {"taskset": id, "path": folder put first on sys.path or "", "index": task position,
"harness": id or "" (the taskset's default), "taskset_options": {...}, "harness_options": {...},
"model": the model id}. The rollout is verifiers' own (its Env, interception server, harness
program and `@vf.reward` functions) with two local choices:
- the model is the job's recording proxy: OPENAI_BASE_URL / OPENAI_API_KEY, which the relay sets;
- the runtime is verifiers' `subprocess` one (the sandbox already isolates it), whose harness
  programs (PEP 723 scripts verifiers would resolve with `uv` from the package index, unreachable
  here) run with this venv's python, which holds their dependencies (openai, mcp, httpx, ...).
REPORT: {"reward": the trace's reward (sum of its weighted rewards), "rewards": each,
"ok", "errors"}; the handler takes `reward` as the row's reward.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import sys
from typing import Any


async def _venv_script(self: Any, script: str | bytes, env: dict[str, str] | None = None, *,
                       activate: bool = True) -> list[str]:
    """SubprocessRuntime.prepare_uv_script without uv: the script, run by this venv's python."""
    data = script.encode() if isinstance(script, str) else script
    path = f"{self.scripts_dir}/{hashlib.sha256(data).hexdigest()}.py"
    await self.write(path, data)
    return [sys.executable, path]


def _environment(spec: dict[str, Any]) -> Any:
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config  # type: ignore[import-not-found]

    agent: dict[str, Any] = {"runtime": {"type": "subprocess"}}
    if spec.get("harness"):
        agent["harness"] = {"id": spec["harness"], **spec.get("harness_options", {})}
    return load_environment(resolve_env_config(
        {"taskset": {"id": spec["taskset"], **spec.get("taskset_options", {})}, "agent": agent}))


async def rollout(spec: dict[str, Any]) -> dict[str, Any]:
    from verifiers.v1.clients import EvalClientConfig, ModelContext  # type: ignore[import-not-found]
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime  # type: ignore[import-not-found]

    SubprocessRuntime.prepare_uv_script = _venv_script
    env = _environment(spec)
    index = int(spec.get("index", 0))
    task = next(itertools.islice(iter(env.taskset), index, None), None)
    if task is None:
        raise IndexError(f"taskset {spec['taskset']!r} has no task at index {index}")
    client = EvalClientConfig(base_url=os.environ["OPENAI_BASE_URL"], api_key_var="OPENAI_API_KEY")
    context = ModelContext(client=client, model=spec.get("model") or "policy")
    async with env.serving():
        episode = await env.run_slot(env.slots(task, 1)[0], context)
    errors = [str(error) for error in episode.errors]
    traces = list(episode.traces)
    if not traces:
        return {"reward": None, "ok": False, "errors": errors or ["the episode ran no agent"]}
    trace = traces[0]
    errors += [str(error) for error in trace.errors]
    rewards = {name: (None if value is None else value.value) for name, value in trace.rewards.items()}
    return {"reward": trace.reward, "rewards": rewards, "ok": bool(episode.ok), "errors": errors,
            "reply": trace.last_reply[-2000:]}


def main() -> None:
    spec_path, report_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as handle:
        spec = json.load(handle)
    if spec.get("path"):
        sys.path.insert(0, spec["path"])
    report = asyncio.run(rollout(spec))
    with open(report_path, "w") as handle:
        json.dump(report, handle)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

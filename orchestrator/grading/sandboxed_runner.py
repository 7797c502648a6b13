"""The worker's side of code_runner.py: put it and its spec in a grading sandbox, run it, and take
its result only when it carries the nonce this call gave it (code_runner.py says why that holds)."""

from __future__ import annotations

import hmac
import json
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.sandbox.base import Sandbox

RUNNER = Path(__file__).with_name("code_runner.py")
GRADING_DIR = "/workspace/.grading"
MODES = ("tests", "checks", "pytest")


async def run_runner(sandbox: "Sandbox", mode: str, spec: dict[str, Any],
                     budget_s: float) -> tuple[dict[str, Any] | None, str]:
    """(the runner's result, "") or (None, why there is none: the runner failed, or something else
    wrote the result)."""
    if mode not in MODES:
        raise ValueError(f"runner mode {mode!r}; valid: {', '.join(MODES)}")
    nonce = secrets.token_hex(16)
    # Reaping needs the sandbox's own PID namespace: the `local` runtime shares the host's.
    signed = {**spec, "nonce": nonce, "reap": sandbox.kind != "local"}
    spec_path, out_dir = f"{GRADING_DIR}/spec.json", f"{GRADING_DIR}/out"
    await sandbox.upload(RUNNER, f"{GRADING_DIR}/runner.py")
    await sandbox.upload(json.dumps(signed).encode(), spec_path)
    ran = await sandbox.bash(f"python3 -I {GRADING_DIR}/runner.py {mode} {spec_path} {out_dir}", timeout=budget_s)
    fetched = await sandbox.download(f"{out_dir}/result.json")
    if ran.exit_code != 0 or fetched.error or fetched.content is None:
        return None, f"the grading runner failed (exit {ran.exit_code}): {ran.output[-500:]}"
    try:
        result = json.loads(fetched.content)
    except ValueError:
        return None, "the grading runner's result is not JSON"
    if not isinstance(result, dict) or not hmac.compare_digest(str(result.get("nonce", "")), nonce):
        return None, "the grading result lacks this run's nonce: something other than the runner wrote it"
    return result, ""

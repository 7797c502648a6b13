"""mini-swe-agent (a real third-party harness from the package index) for the proxy tests:
installed once into a virtualenv of the system python3 (the interpreter the `tasks` image has
too: Debian's 3.11) in the cache, then bound read-only into sandboxes at /mini-swe-agent (a new
top-level directory: a path inside the image, e.g. under /root, cannot be made in its read-only
tree) and run with that venv's python, which finds its packages from the path it is called by.

The install takes 2-6 min and ~710 MB (litellm, openai, datasets, textual, ...); set
MINI_SWE_AGENT_VENV to reuse one made elsewhere. scripts/test.sh starts it in the background
(`python -m tests.proxy.mini_swe_agent`); the tests wait for that install before looking.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.background import log_tail, wait_for_background

VERSION = "2.4.6"
SYSTEM_PYTHON = "/usr/bin/python3"
# Offline settings that matter (reference: agent-harness-facts.md): no cost-map fetch, no first-run
# prompt, unknown model costs ignored, a refused call fails at once instead of minutes of retries.
ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_CONFIGURED": "true", "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mswea",
    "MSWEA_SILENT_STARTUP": "1", "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
}


def venv_path() -> Path:
    configured = os.environ.get("MINI_SWE_AGENT_VENV")
    if configured:
        return Path(configured)
    base = os.environ.get("HPC_ROLLOUT_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "hpc-rollout") / "harness" / f"mini-swe-agent-{VERSION}"


BACKGROUND_INSTALL_PID = "HPC_ROLLOUT_HARNESS_INSTALL_PID"   # set by scripts/test.sh
BACKGROUND_INSTALL_LOG = "HPC_ROLLOUT_HARNESS_INSTALL_LOG"


def installed_for_tests() -> Path:
    """The venv, after the background install of scripts/test.sh (if any) has ended."""
    wait_for_background(BACKGROUND_INSTALL_PID, "mini-swe-agent install")
    try:
        return ensure_installed()
    except Exception as error:
        raise AssertionError(f"no mini-swe-agent: {error}\n{log_tail(BACKGROUND_INSTALL_LOG)}") from error


def ensure_installed() -> Path:
    """The virtualenv with `mini`, installed now when missing (a venv cannot be moved after it
    is made, so it is built in place and marked complete last)."""
    venv = venv_path()
    marker = venv / ".complete"
    if marker.exists() or (os.environ.get("MINI_SWE_AGENT_VENV") and (venv / "bin" / "mini").exists()):
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"mini-swe-agent=={VERSION}"],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"pip install mini-swe-agent=={VERSION} failed: {done.stderr[-2000:]}")
    marker.write_text(VERSION + "\n")
    return venv


INSIDE = "/mini-swe-agent"


def bind(venv: Path) -> str:
    return f"{venv}:{INSIDE}:ro"


def command() -> str:
    """`mini` non-interactive, tool-calling mode, against the job's proxy."""
    return (f"{INSIDE}/bin/python {INSIDE}/bin/mini -m openai/policy -t \"$(cat $HPC_ROLLOUT_TASK_FILE)\" --yolo --exit-immediately "
            "-c mini.yaml -c model.model_kwargs.api_base=$OPENAI_BASE_URL "
            "-c model.model_kwargs._skip_mcp_handler=true -o /workspace/.harness/trajectory.json")


if __name__ == "__main__":
    print(ensure_installed())

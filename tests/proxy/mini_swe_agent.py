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

from pathlib import Path

from tests.proxy.cached_venv import CachedVenv

VERSION = "2.4.6"
# Offline settings that matter (reference: agent-harness-facts.md): no cost-map fetch, no first-run
# prompt, unknown model costs ignored, a refused call fails at once instead of minutes of retries.
ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_CONFIGURED": "true", "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mswea",
    "MSWEA_SILENT_STARTUP": "1", "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
}


# scripts/test.sh's background install exports HPC_ROLLOUT_HARNESS_INSTALL_PID / _LOG.
VENV = CachedVenv(f"mini-swe-agent=={VERSION}", f"mini-swe-agent-{VERSION}", "MINI_SWE_AGENT_VENV", "mini",
                  "HPC_ROLLOUT_HARNESS_INSTALL_PID", "HPC_ROLLOUT_HARNESS_INSTALL_LOG")


def installed_for_tests() -> Path:
    """The venv, after the background install of scripts/test.sh (if any) has ended."""
    return VENV.for_tests()


INSIDE = "/mini-swe-agent"


def bind(venv: Path) -> str:
    return f"{venv}:{INSIDE}:ro"


def command() -> str:
    """`mini` non-interactive, tool-calling mode, against the job's proxy."""
    return (f"{INSIDE}/bin/python {INSIDE}/bin/mini -m openai/policy -t \"$(cat $HPC_ROLLOUT_TASK_FILE)\" --yolo --exit-immediately "
            "-c mini.yaml -c model.model_kwargs.api_base=$OPENAI_BASE_URL "
            "-c model.model_kwargs._skip_mcp_handler=true -o /workspace/.harness/trajectory.json")


if __name__ == "__main__":
    print(VENV.ensure())

"""The `harness` image (Node.js, Claude Code and Codex CLI from npm, on the task image) for the CLI
tests: built once into the cache by the project's image tooling. scripts/test.sh builds it in the
background after the task image (`python -m hpc_rollout.handlers.bundled.image harness`); the
tests wait for that build before looking."""

from __future__ import annotations

from pathlib import Path

from tests.background import log_tail, wait_for_background

BACKGROUND_BUILD_PID = "HPC_ROLLOUT_HARNESS_IMAGE_BUILD_PID"   # set by scripts/test.sh
BACKGROUND_BUILD_LOG = "HPC_ROLLOUT_HARNESS_IMAGE_BUILD_LOG"


def harness_image_for_tests() -> Path:
    from hpc_rollout.handlers.bundled.image import harness_image

    wait_for_background(BACKGROUND_BUILD_PID, "harness image build")
    try:
        return harness_image()
    except Exception as error:
        raise AssertionError(f"no harness image: {error}\n{log_tail(BACKGROUND_BUILD_LOG)}") from error

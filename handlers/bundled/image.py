"""The sandbox images the bundled tasks need, as bubblewrap directories built once into the
cache and reused until their template or its packages change:

    bundled_image()    images/tasks.def.j2: python3, numpy, sympy, pytest, git (math, code, swe)
    harness_image()    images/harness.def.j2 layered on it: Node.js, Claude Code and Codex CLI
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

TEMPLATE = "tasks"
HARNESS_TEMPLATE = "harness"


def image_cache() -> Path:
    base = os.environ.get("HPC_ROLLOUT_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "hpc-rollout") / "images"


def _cached_build(name: str, variables: dict[str, Any]) -> Path:
    from orchestrator.sandbox.images.builder import build_image
    from orchestrator.sandbox.images.templates import default_variables, find_template

    template = find_template(name)
    # The versioned cache key covers the framework version: fold the template, its packages
    # and the given variables into it, so an edited template is rebuilt instead of reused.
    digest = hashlib.sha256(template.read_bytes() + repr(sorted(default_variables(name).items())).encode()
                            + (repr(sorted(variables.items())).encode() if variables else b""))
    variables = {**variables, "framework_version": f"{name}-{digest.hexdigest()[:12]}"}
    return build_image(template, fmt="dir", out_dir=image_cache(), variables=variables).path


def bundled_image() -> Path:
    """HPC_ROLLOUT_TASK_IMAGE when set, else the cached build (built now when missing; needs
    mmdebstrap, or debootstrap as root, and the Debian mirror)."""
    configured = os.environ.get("HPC_ROLLOUT_TASK_IMAGE")
    if configured:
        return Path(configured)
    return _cached_build(TEMPLATE, {})


def harness_image() -> Path:
    """HPC_ROLLOUT_HARNESS_IMAGE when set, else the `harness` layer on the task image, cached
    (built now when missing: a copy of the task image, then Debian's nodejs and the CLIs from
    the npm registry)."""
    configured = os.environ.get("HPC_ROLLOUT_HARNESS_IMAGE")
    if configured:
        return Path(configured)
    return _cached_build(HARNESS_TEMPLATE, {"bootstrap": "localimage", "from_image": str(bundled_image())})


if __name__ == "__main__":
    import sys

    print(harness_image() if sys.argv[1:] == ["harness"] else bundled_image())

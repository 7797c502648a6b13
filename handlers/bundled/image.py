"""The sandbox image the bundled tasks need: `images/tasks.def.j2` as a bubblewrap directory,
built once into the cache and reused until the template or its packages change."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

TEMPLATE = "tasks"


def image_cache() -> Path:
    base = os.environ.get("HPC_ROLLOUT_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "hpc-rollout") / "images"


def bundled_image() -> Path:
    """HPC_ROLLOUT_TASK_IMAGE when set, else the cached build (built now when missing; needs
    mmdebstrap, or debootstrap as root, and the Debian mirror)."""
    configured = os.environ.get("HPC_ROLLOUT_TASK_IMAGE")
    if configured:
        return Path(configured)
    from orchestrator.sandbox.images.builder import build_image
    from orchestrator.sandbox.images.templates import default_variables, find_template

    template = find_template(TEMPLATE)
    # The versioned cache key covers the framework version: fold the template and its
    # packages into it, so an edited template is rebuilt instead of reused.
    digest = hashlib.sha256(template.read_bytes() + repr(sorted(default_variables(TEMPLATE).items())).encode())
    variables = {"framework_version": f"tasks-{digest.hexdigest()[:12]}"}
    return build_image(template, fmt="dir", out_dir=image_cache(), variables=variables).path

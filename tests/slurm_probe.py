"""Whether a usable Slurm cluster is here (scripts/slurm-up.sh starts one), for every test that needs it."""

from __future__ import annotations

import subprocess

from orchestrator.slurm.cluster import slurm_available

NODES_NEEDED = 4


def cluster_problem() -> str | None:
    """None when the cluster is up with enough usable nodes, else what is missing and how to get it."""
    if not slurm_available():
        return "no Slurm client on PATH: start the cluster with `sudo SLURM_NODES=4 scripts/slurm-up.sh`"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
        nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t"],
                               capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "the Slurm controller does not answer"
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return "the Slurm controller is down: `sudo SLURM_NODES=4 scripts/slurm-up.sh`"
    # Busy is fine (a previous test's tasks may still be completing); down or drained is not.
    usable = {line.split()[0] for line in nodes.stdout.splitlines()
              if line.split()[1].rstrip("*~#$@+") in ("idle", "mix", "alloc", "comp", "mixed", "allocated")}
    if len(usable) < NODES_NEEDED:
        return f"the Slurm tests need {NODES_NEEDED} usable nodes, found {sorted(usable)}: SLURM_NODES=4 scripts/slurm-up.sh"
    return None

"""Starting the two agents and collecting what they printed.

  local        two processes on this node (one filesystem client: only atomicity and flushes
               say something; visibility between nodes needs two)
  a prefix     both agents started through a command prefix (e.g. `ssh node17`, or a node of
               the test rig), given the run directory as they see it
  Slurm        one sbatch of two nodes, one agent per node (srun), waited for; its output in
               the run's logs/
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator.doctor.channel import DoctorError
from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

AGENT = [sys.executable, "-m", "orchestrator.doctor.agent"]
AGENT_TIMEOUT_S = 900.0


def meeting_dir(paths: SpoolPaths) -> Path:
    """A fresh directory of the run for one measurement (removed afterwards)."""
    meeting = paths.control / f"doctor-{secrets.token_hex(4)}"
    fsops.ensure_dir(meeting)
    return meeting


def parse_outputs(text: str) -> dict[str, dict[str, Any]]:
    """The agents' JSON lines by role (other output lines are ignored)."""
    found: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith('{"doctor"'):
            record = json.loads(line)
            found[record["doctor"]] = record
    return found


def run_agents(meeting: Path, agent_meeting: Path, prefix: list[str]) -> dict[str, dict[str, Any]]:
    """Both agents through `prefix` (empty: local processes), `agent_meeting` being the meeting
    directory as they see it."""
    processes = [subprocess.Popen([*prefix, *AGENT, str(agent_meeting), "--role", role], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
                 for role in ("watcher", "maker")]
    outputs, errors = [], []
    try:
        for process in processes:
            out, err = process.communicate(timeout=AGENT_TIMEOUT_S)
            outputs.append(out)
            errors.append(err)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    found = parse_outputs("".join(outputs))
    if set(found) != {"watcher", "maker"}:
        raise DoctorError("an agent did not report: " + " | ".join(e.strip().splitlines()[-1] for e in errors if e.strip()))
    return found


def run_on_slurm(paths: SpoolPaths, meeting: Path, sbatch_flags: list[str]) -> dict[str, dict[str, Any]]:
    """One sbatch of two nodes, one agent each; waits for it (sbatch --wait)."""
    if shutil.which("sbatch") is None:
        raise DoctorError("--nodes 2 needs Slurm's sbatch on PATH; without Slurm, run the two agents through a "
                          "command of your own: --agents-via 'ssh OTHER_NODE'")
    fsops.ensure_dir(paths.logs)
    output = paths.logs / f"{meeting.name}.out"
    command = shlex.join(["srun", "--kill-on-bad-exit=1", *AGENT, str(meeting)])
    done = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=2", "--ntasks-per-node=1",
                           "--job-name=hpc-rollout-doctor", f"--output={output}", *sbatch_flags, "--wrap", command],
                          capture_output=True, text=True, timeout=AGENT_TIMEOUT_S + 600)
    text = output.read_text(errors="replace") if output.exists() else ""
    found = parse_outputs(text)
    if done.returncode != 0 or set(found) != {"watcher", "maker"}:
        raise DoctorError(f"the doctor's Slurm job failed (sbatch exit {done.returncode}: "
                          f"{(done.stderr.strip() or text.strip()).splitlines()[-1:] or ['no output']}); see {output}")
    return found

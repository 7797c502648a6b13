"""`hpc-rollout doctor`: on a local spool, and on the rig, where it must find the delays the rig's
views are set to (within 20 %); the lease it records is then enforced by `launch` and the workers."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from tests.core.util import cli, make_run, start_worker
from tests.fsrig.conftest import needs_rig, quick
from tests.fsrig.rig import Rig

pytestmark = needs_rig


def test_on_one_node_every_property_holds_and_nothing_is_recorded(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    done = cli("doctor", str(paths.root), "--json")
    report = json.loads(done.stdout)
    assert all(v["ok"] for v in report["verdicts"]), [v for v in report["verdicts"] if not v["ok"]]
    names = {v["name"] for v in report["verdicts"]}
    assert {"atomic rename (claims)", "exclusive create (leases, tokens)", "link()", "fsync of a directory",
            "rename onto a non-empty directory fails (locks)"} <= names
    assert report["record"] is None and not (paths.control / "filesystem.json").exists()
    assert report["results"]["visible_change_s"] < 0.5   # one client: nothing between the agents
    text = cli("doctor", str(paths.root)).stderr
    assert "--nodes 2" in text, text
    assert not list(paths.control.glob("doctor-*")), "the meeting directory is removed"


def test_on_the_rig_it_finds_the_cache_times_and_launch_then_holds_the_lease_to_them(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "server", tmp_path / "view", quick(acregmin=2.0, acdirmin=5.0))
    rig.base.mkdir()
    rig.at.mkdir()
    paths = make_run(rig.base / "run", **{"leases.heartbeat_s": 1.0, "leases.lease_s": 3.0})
    prefix = shlex.join(rig.node([]))
    done = cli("doctor", str(paths.root), "--agents-via", prefix, "--agent-run-dir",
               str(rig.seen_from_node(paths.root)), "--json", timeout=300)
    report = json.loads(done.stdout)
    delays = report["results"]
    assert 4.0 <= delays["visible_create_s"] <= 6.0, delays        # the negative lookup: acdirmin
    assert delays["visible_create_after_opendir_s"] <= 0.5, delays  # opened first: close-to-open
    assert 1.6 <= delays["visible_change_s"] <= 2.4, delays        # a replaced file: acregmin
    assert report["filesystem"] == "fuse" and all(v["ok"] for v in report["verdicts"]), report["verdicts"]
    assert report["recommended"]["lease_s"] >= 2 * (1.0 + delays["visible_change_s"])
    record = json.loads((paths.control / "filesystem.json").read_text())
    assert record["delays_s"]["visible_change_s"] == delays["visible_change_s"]

    # A lease of 3 s is shorter than 2 x (heartbeat 1 s + 2 s): refused where workers start.
    launched = cli("launch", str(paths.root), "--local", "--workers", "1", check=False)
    assert launched.returncode == 1 and "leases.lease_s = 3 is too short for this filesystem" in launched.stderr, \
        launched.stderr
    needed = report["recommended"]["lease_s"]   # 6 for a delay of 2 s, 6.1 for 2.01 s: rounded up
    assert 6.0 <= needed <= 6.9 and f"--set leases.lease_s={needed:g}" in launched.stderr, launched.stderr
    worker = start_worker(paths)
    assert worker.wait(timeout=60) != 0
    logs = "".join(p.read_text() for p in paths.root.glob("worker-*.log"))
    assert "is too short for this filesystem" in logs, logs
    subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", "init", str(paths.root),
                    "--set", f"leases.lease_s={needed:g}"], check=True, capture_output=True)
    assert cli("launch", str(paths.root), "--local", "--workers", "1", "--wait").returncode == 0

"""The rig's views behave like NFS clients: what each caches, how long, and what stays exact.

Two nodes (each its own mount namespace and view of one directory) are driven side by side;
their own clocks time what they saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.fsrig.conftest import needs_rig, quick, run_node
from tests.fsrig.rig import REPO, Rig

pytestmark = needs_rig

WATCH_A_NAME = """
import os, sys, time
directory, name, how = sys.argv[1], sys.argv[2], sys.argv[3]
os.path.exists(os.path.join(directory, name))            # looked up while missing: "does not exist" cached
looked = time.monotonic()
print("looked", flush=True)
sys.stdin.readline()                                     # ...until the other node has created it
created = time.monotonic()
while True:
    if how == "opendir":
        os.close(os.open(directory, os.O_RDONLY | os.O_DIRECTORY))
    if os.path.exists(os.path.join(directory, name)):
        break
    time.sleep(0.05)
print(round(time.monotonic() - looked, 2), round(time.monotonic() - created, 2))
"""


def seen_after(rig: Rig, how: str) -> tuple[float, float]:
    """Seconds a node that looked a name up while missing takes to find it, from its lookup and
    from the moment the server has it."""
    (rig.base / "d").mkdir(exist_ok=True)
    name = f"{how}-{time.monotonic_ns()}"
    watcher = subprocess.Popen(rig.node([sys.executable, "-c", WATCH_A_NAME, str(rig.at / "d"), name, how]),
                               cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert watcher.stdout is not None and watcher.stdin is not None
    assert watcher.stdout.readline().strip() == "looked"
    run_node(rig, f"open({str(rig.at / 'd' / name)!r}, 'w').write('x')")   # created by another node
    watcher.stdin.write("\n")
    watcher.stdin.flush()
    since_lookup, since_created = (float(part) for part in watcher.stdout.readline().split())
    assert watcher.wait(timeout=30) == 0
    return since_lookup, since_created


def test_a_name_another_node_created_stays_missing_until_the_directory_is_seen_changed(
        rig_dirs: tuple[Path, Path]) -> None:
    rig = Rig(*rig_dirs, quick(acdirmin=4.0))
    assert 3.5 <= seen_after(rig, "lookup")[0] <= 5.5       # lookupcache=all: until acdirmin has passed
    assert seen_after(rig, "opendir")[1] <= 0.5              # close-to-open: opening the directory revalidates it
    nocto = Rig(*rig_dirs, quick(acdirmin=4.0, cto=False))
    assert 3.5 <= seen_after(nocto, "opendir")[0] <= 5.5    # nocto: opening it changes nothing


RENAMED_OVER = """
import json, os, sys, time
path = sys.argv[1]
os.stat(path)                                            # its attributes cached (size included)
print("stat", flush=True)
sys.stdin.readline()                                     # ...until the other node renamed a longer one over it
with open(path, "rb") as handle:
    data = handle.read()
print(len(data))
"""


def read_after_rename_over(rig: Rig) -> int:
    path = rig.base / "ticket.json"
    path.write_text(json.dumps({"a": 1}))
    reader = subprocess.Popen(rig.node([sys.executable, "-c", RENAMED_OVER, str(rig.at / "ticket.json")]),
                              cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert reader.stdout is not None and reader.stdin is not None
    assert reader.stdout.readline().strip() == "stat"
    run_node(rig, f"""
import json, os
open({str(rig.at / 'new.json')!r}, 'w').write(json.dumps({{"a": "{'x' * 100}"}}))
os.replace({str(rig.at / 'new.json')!r}, {str(rig.at / 'ticket.json')!r})
""")
    reader.stdin.write("\n")
    reader.stdin.flush()
    size = int(reader.stdout.readline())
    assert reader.wait(timeout=30) == 0
    return size


def test_without_close_to_open_a_file_renamed_over_reads_cut_to_the_size_last_seen(
        rig_dirs: tuple[Path, Path]) -> None:
    whole = len(json.dumps({"a": "x" * 100}))
    assert read_after_rename_over(Rig(*rig_dirs, quick(acregmin=5.0))) == whole
    assert read_after_rename_over(Rig(*rig_dirs, quick(acregmin=5.0, cto=False))) == len(json.dumps({"a": 1}))


RACE = """
import os, sys, time
at, me, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < start:
    time.sleep(0.001)
wins = []
for n in range(20):
    try:
        os.rename(f"{at}/queue/t{n}", f"{at}/claims-{me}/t{n}")
        wins.append(f"rename{n}")
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(f"{at}/lock{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        wins.append(f"create{n}")
    except FileExistsError:
        pass
    os.mkdir(f"{at}/mine-{me}-{n}")
    open(f"{at}/mine-{me}-{n}/token", "w").write(me)
    try:
        os.rename(f"{at}/mine-{me}-{n}", f"{at}/dirlock{n}")
        wins.append(f"dir{n}")
    except OSError:
        pass
print(" ".join(wins))
"""


def test_claims_creates_and_directory_locks_stay_exclusive_across_views(rig_dirs: tuple[Path, Path]) -> None:
    rig = Rig(*rig_dirs, quick())
    (rig.base / "queue").mkdir()
    for me in ("a", "b"):
        (rig.base / f"claims-{me}").mkdir()
    for n in range(20):
        (rig.base / "queue" / f"t{n}").write_text(str(n))
    start = time.time() + 1.5
    nodes = [subprocess.Popen(rig.node([sys.executable, "-c", RACE, str(rig.at), me, str(start)]), cwd=REPO,
                              stdout=subprocess.PIPE, text=True) for me in ("a", "b")]
    wins = [set(node.communicate(timeout=60)[0].split()) for node in nodes]
    assert not wins[0] & wins[1], wins[0] & wins[1]
    assert wins[0] | wins[1] == {f"{kind}{n}" for kind in ("rename", "create", "dir") for n in range(20)}

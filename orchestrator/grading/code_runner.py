"""Runs hidden tests inside a sandbox (standard library only; uploaded next to the solution).

    python3 code_runner.py SPEC.json RESULT.json

SPEC: {"command": ["python3", "solution.py"], "tests": [{"input": ..., "output": ...}, ...],
       "time_limit_s": 2, "memory_mb": 512, "checker": "checker.py" | null, "stop_on_failure": false}
Each test runs the command with the input on stdin, under RLIMIT_AS / RLIMIT_CPU and a wall
clock limit. Without a checker the output matches when its whitespace-separated tokens equal
the expected ones; with one, `python3 CHECKER INPUT EXPECTED OUTPUT` exiting 0 means it matches.
"""

from __future__ import annotations   # annotations stay strings: any python3 in an image runs this

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable


def limits(memory_mb: int, cpu_s: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    return apply


def matches(spec: dict[str, Any], test: dict[str, Any], output: str, workdir: str) -> bool:
    checker = spec.get("checker")
    if not checker:
        return output.split() == str(test["output"]).split()
    paths = []
    for name, text in (("input", test["input"]), ("expected", test["output"]), ("output", output)):
        path = os.path.join(workdir, name + ".txt")
        with open(path, "w") as fh:
            fh.write(str(text))
        paths.append(path)
    done = subprocess.run([sys.executable, checker] + paths, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    return done.returncode == 0


def run_one(spec: dict[str, Any], test: dict[str, Any], workdir: str) -> dict[str, Any]:
    limit = float(spec.get("time_limit_s", 2))
    started = time.monotonic()
    try:
        done = subprocess.run(
            spec["command"], input=str(test["input"]).encode(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, timeout=limit,
            preexec_fn=limits(int(spec.get("memory_mb", 512)), int(limit) + 1),
        )
    except subprocess.TimeoutExpired:
        return {"status": "time_limit", "ms": round((time.monotonic() - started) * 1000, 3)}
    except OSError as exc:
        return {"status": "runtime_error", "error": str(exc), "ms": 0.0}
    ms = round((time.monotonic() - started) * 1000, 3)
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace")
        status = "memory_limit" if "MemoryError" in stderr else "runtime_error"
        if done.returncode in (-9, -24):   # SIGKILL / SIGXCPU from RLIMIT_CPU
            status = "time_limit"
        return {"status": status, "exit_code": done.returncode, "error": stderr[-500:], "ms": ms}
    output = done.stdout.decode("utf-8", "replace")
    return {"status": "passed" if matches(spec, test, output, workdir) else "wrong_answer", "ms": ms}


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    results = []
    workdir = tempfile.mkdtemp(prefix="checker-")
    for test in spec["tests"]:
        results.append(run_one(spec, test, workdir))
        if spec.get("stop_on_failure") and results[-1]["status"] != "passed":
            break
    with open(sys.argv[2], "w") as fh:
        json.dump({"results": results}, fh)


if __name__ == "__main__":
    main()

"""The code type-checks: mypy, with the settings in pyproject.toml's [tool.mypy], finds nothing.

Those settings ask for full type hints (an unannotated function is an error) and read the
untyped libraries (pyarrow, submitit, verl...) as Any; see the comments there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# mypy's incremental cache, kept between runs like the project's other caches (HPC_ROLLOUT_CACHE):
# a fresh clone is checked in seconds instead of a minute. mypy trusts a cached module only while
# its source hash is unchanged, so the cache never hides an error.
CACHE = Path(os.environ.get("HPC_ROLLOUT_CACHE") or Path.home() / ".cache" / "hpc-rollout") / "mypy"


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_package_and_handlers_type_check() -> None:
    done = mypy("--cache-dir", str(CACHE))
    assert done.returncode == 0, f"mypy found problems (run `python -m mypy` at the repository root):\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
    assert "no issues found" in done.stdout


def test_the_settings_catch_a_wrong_type_and_a_missing_hint(tmp_path: Path) -> None:
    module = tmp_path / "sample.py"
    module.write_text("def half(n: int) -> int:\n    return n / 2\n\n\ndef untyped(x):\n    return x\n")
    done = mypy("--cache-dir", str(tmp_path / "cache"), str(module), cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert "sample.py:2: error: Incompatible return value type" in done.stdout
    assert "sample.py:5: error: Function is missing a type annotation" in done.stdout

"""Write the bundled task sets, their git mirrors and scripted policies into a directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_rollout.handlers.bundled import code_problems, math_problems
from hpc_rollout.handlers.bundled.swe_repos import REPOS, Edit, SweRepo

FAMILIES = ("math", "code", "swe")
# Fixed identities and dates: the same commits (and ids) on every machine.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "hpc-rollout", "GIT_AUTHOR_EMAIL": "tasks@hpc-rollout.invalid",
    "GIT_COMMITTER_NAME": "hpc-rollout", "GIT_COMMITTER_EMAIL": "tasks@hpc-rollout.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
}


MIRRORS = "swe-repos"


@dataclass(frozen=True)
class Bundled:
    directory: Path
    math: Path
    code: Path
    swe: Path
    right: Path          # scripted replies that solve every task
    wrong: Path          # scripted replies that do not (a wrong answer, a wrong program, no change)
    decoy: Path          # swe: a fix that passes FAIL_TO_PASS but breaks PASS_TO_PASS

    def tasks(self, family: str) -> Path:
        return {"math": self.math, "code": self.code, "swe": self.swe}[family]

    @property
    def mirrors(self) -> Path:
        """The SWE rows' git mirrors (their `repo_mirror`s): a run must allow binding them (run.toml
        [sandbox] allowed_binds)."""
        return self.directory / MIRRORS


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _git(cwd: Path, *args: str, date: str = "2024-01-01T12:00:00+00:00") -> str:
    env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {cwd} failed: {done.stderr.strip()}")
    return done.stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _diff_of(work: Path, edit: Edit | tuple[str, str]) -> str:
    if isinstance(edit, Edit):
        path = work / edit.path
        text = path.read_text()
        if text.count(edit.old) != 1:
            raise RuntimeError(f"edit of {edit.path}: the old text must occur exactly once")
        path.write_text(text.replace(edit.old, edit.new))
    else:
        path = work / edit[0]
        path.write_text(path.read_text() + edit[1])
    diff = _git(work, "diff")
    _git(work, "checkout", "--", ".")
    return diff


def build_repo(repo: SweRepo, mirrors: Path) -> tuple[dict[str, Any], str]:
    """Make the repository's history, its bare mirror, and its task row (+ the decoy patch)."""
    with tempfile.TemporaryDirectory(prefix=f"swe-{repo.name}-") as scratch:
        work = Path(scratch) / repo.name
        work.mkdir()
        _git(work, "init", "-q", "-b", "main")
        _write(work, repo.skeleton)
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "-m", "Initial skeleton", date="2024-01-01T12:00:00+00:00")
        _write(work, repo.feature)
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "-m", f"Add {repo.name}", date="2024-01-02T12:00:00+00:00")
        base = _git(work, "rev-parse", "HEAD").strip()
        test_patch = _diff_of(work, (repo.test_file, repo.new_tests))
        golden = _diff_of(work, repo.fix)
        decoy = _diff_of(work, repo.decoy)
        mirror = mirrors / f"{repo.name}.git"
        if mirror.exists():
            shutil.rmtree(mirror)
        _git(work, "clone", "-q", "--bare", str(work), str(mirror))
    row = {
        "instance_id": f"{repo.name}-1", "repo": f"bundled/{repo.name}", "base_commit": base,
        "problem_statement": repo.problem_statement, "test_patch": test_patch, "patch": golden,
        "FAIL_TO_PASS": list(repo.fail_to_pass), "PASS_TO_PASS": list(repo.pass_to_pass),
        "repo_mirror": str(mirror.absolute()),
    }
    return row, decoy


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def math_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    rows, right, wrong = [], [], []
    for index, (problem, answer, code, bad) in enumerate(math_problems.PROBLEMS):
        rows.append({"instance_id": f"math-{index:02d}", "problem": problem, "answer": answer})
        right.append({"match": problem, "replies": [
            "Let me compute it.\n" + tool_call("python", code=code), tool_call("submit", answer=answer)]})
        wrong.append({"match": problem, "replies": [f"The answer is \\boxed{{{bad}}}."]})
    return rows, right, wrong


def code_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    rows, right, wrong = [], [], []
    for problem in code_problems.PROBLEMS:
        row = {"instance_id": f"code-{problem['name']}", "statement": problem["statement"],
               "tests": problem["tests"], "solution": problem["solution"]}
        if "checker" in problem:
            row["checker"] = problem["checker"]
        rows.append(row)
        example = problem["tests"][0]["input"]
        right.append({"match": problem["statement"], "replies": [
            tool_call("str_replace_editor", command="create", path="solution.py", file_text=problem["solution"]),
            tool_call("bash", command=f"printf %s {json.dumps(example)} | python3 solution.py"),
            tool_call("finish", message="solution.py reads the input and prints the answer")]})
        wrong.append({"match": problem["statement"], "replies": [
            tool_call("str_replace_editor", command="create", path="solution.py", file_text="print(0)\n"),
            tool_call("finish")]})
    return rows, right, wrong


def swe_rows(mirrors: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    rows, right, wrong, decoys = [], [], [], []
    for repo in REPOS:
        row, _ = build_repo(repo, mirrors)
        rows.append(row)
        title = repo.problem_statement.splitlines()[0]
        target = f"/workspace/repo/{repo.fix.path}"
        right.append({"match": title, "replies": [
            tool_call("bash", command=f"git log --oneline | head -3 && cat {repo.fix.path}"),
            tool_call("str_replace_editor", command="str_replace", path=target, old_str=repo.fix.old, new_str=repo.fix.new),
            tool_call("bash", command="python3 -m pytest -q -p no:cacheprovider"),
            tool_call("finish", message="fixed")]})
        wrong.append({"match": title, "replies": [tool_call("bash", command="ls"), tool_call("finish")]})
        decoys.append({"match": title, "replies": [
            tool_call("str_replace_editor", command="str_replace", path=f"/workspace/repo/{repo.decoy.path}",
                      old_str=repo.decoy.old, new_str=repo.decoy.new),
            tool_call("finish")]})
    return rows, right, wrong, decoys


def write_bundled(directory: Path) -> Bundled:
    directory = directory.absolute()
    (directory / "scripts").mkdir(parents=True, exist_ok=True)
    (directory / MIRRORS).mkdir(exist_ok=True)
    math, math_right, math_wrong = math_rows()
    code, code_right, code_wrong = code_rows()
    swe, swe_right, swe_wrong, decoys = swe_rows(directory / MIRRORS)
    return Bundled(
        directory=directory,
        math=_jsonl(directory / "math.jsonl", math),
        code=_jsonl(directory / "code.jsonl", code),
        swe=_jsonl(directory / "swe.jsonl", swe),
        right=_jsonl(directory / "scripts" / "right.jsonl", math_right + code_right + swe_right),
        wrong=_jsonl(directory / "scripts" / "wrong.jsonl", math_wrong + code_wrong + swe_wrong),
        decoy=_jsonl(directory / "scripts" / "decoy.jsonl", decoys),
    )

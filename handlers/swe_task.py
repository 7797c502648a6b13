"""`swe`: resolve a GitHub-style issue in a repository (SWE-bench / SWE-Gym rows).

Rows: {"instance_id", "repo", "base_commit", "problem_statement", "test_patch", "patch" (the
golden fix, for `tasks check`), "FAIL_TO_PASS", "PASS_TO_PASS" (lists of pytest node ids, or
their JSON as SWE-bench stores them)} plus where the repository comes from: "repo_mirror" (a
local git mirror, bound read-only into the sandbox) or "image" (an image holding the
repository at "repo_dir", default /testbed). verl rows carry these fields in extra_info.
INIT checks the repository out at base_commit in /workspace/repo (history after it is not
fetched; a mirror is bound only into a short-lived sandbox that makes a bundle of that history,
never into the agent's or the tests' sandbox, so no later commit can be read); RUN is the agent
with bash and the editor; the artifact is the final `git diff`; EVAL checks the repository out
again in a fresh sandbox, applies the agent's patch, restores the test files and pytest's
configuration (those the test patch touches, and any the agent's patch touches: TEST_FILE), applies
the test patch, runs the FAIL_TO_PASS and PASS_TO_PASS tests with pytest (code_runner.py: a pytest
the repository cannot shadow, its JUnit report through a pipe), and gives 1.0 only when all of
them pass (SWE-bench's "resolved"), else 0.0 (RULE below).
"""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hpc_rollout.handlers.task_rows import first_text, flatten, optional_image, prompt_messages, string_list
from orchestrator.agent.tool_handler import ToolAgentHandler, agent_task_keys, fresh_sandbox
from orchestrator.agent.loop import AgentLimits, AgentRun, TextReply
from orchestrator.grading.junit import resolution, statuses
from orchestrator.grading.sandboxed_runner import run_runner
from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext
    from orchestrator.sandbox.base import Sandbox

MIRROR = "/mirror"
REPO = "/workspace/repo"
BASE_DIR = "/workspace/.swe-base"        # the bundle of base_commit's history, while it is checked out
CHUNK_BYTES = 48 << 20                   # a bundle crosses the sandboxes' file transfer in parts this big
PATCHED_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# Files that decide which tests run and how: an agent's change to them is undone before EVAL (as
# SWE-bench resets the test files), so a conftest.py, a pytest.ini plugin or an edited test cannot
# pass a test for the fix.
TEST_FILE = re.compile(r"(^|/)tests?/|(^|/)(test_[^/]*|[^/]*_test|tests|conftest)\.py$"
                       r"|(^|/)(pytest\.ini|\.pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml)$")
RULE = RewardRule(
    summary="1 when every FAIL_TO_PASS and PASS_TO_PASS test passes with the agent's patch (SWE-bench's resolved), "
            "else 0",
    graded="the final `git diff` of the repository, applied to a fresh checkout of base_commit; its changes to test "
           "files and pytest's configuration (`test_*.py`, `*_test.py`, `tests/`, `conftest.py`, `pytest.ini`, "
           "`tox.ini`, `setup.cfg`, `pyproject.toml`) are undone, then the test patch is applied",
    against="FAIL_TO_PASS and PASS_TO_PASS, run by pytest (the repository cannot shadow it; its JUnit report reaches "
            "the worker through a pipe, a second report makes it unreadable); a test missing from the report fails",
    range="0 or 1",
    truncated="graded as it stands (a reply cut at the length limit is nudged to go on)",
    failed="no reward (null, status `failed`); a patch that does not apply, a test run past `test_timeout_s` or "
           "no readable report: 0",
    ground_truth=None)
SYSTEM = ("You are a software engineer working in a git repository at /workspace/repo. Read the issue, "
          "find the cause, and fix it by editing the repository's source files with the tools. You may "
          "write and run tests. Do not change existing tests. When the fix is complete, call finish.")
EXCLUDES = "__pycache__/\n*.pyc\n.pytest_cache/\n"


LIMITS = AgentLimits(max_turns=30, max_context_tokens=16384, max_wall_s=1800, tool_timeout_s=120,
                     text_reply=TextReply.NUDGE)
NODE_IDS = (Kind.LIST, Kind.STRING)
UNUSED = "a SWE-bench column, kept, not used"
SCHEMA = InstanceSchema((
    instance_key("instance_id", Kind.STRING, "the task's id (SWE-bench's)"),
    instance_key("repo", Kind.STRING, "owner/name, shown in the prompt"),
    instance_key("base_commit", Kind.STRING, "the commit the repository is checked out at"),
    instance_key("problem_statement", Kind.STRING, "the issue (or a verl 'prompt')"),
    instance_key("test_patch", Kind.STRING, "the patch adding the tests that show the fix"),
    instance_key("patch", Kind.STRING, "the golden fix (for `tasks check`)"),
    instance_key("FAIL_TO_PASS", NODE_IDS, "pytest node ids that must pass after the fix (or their JSON)"),
    instance_key("PASS_TO_PASS", NODE_IDS, "pytest node ids that must keep passing (or their JSON)", default=[]),
    instance_key("repo_mirror", Kind.STRING, "absolute path of a local git mirror, bound read-only (or 'image')"),
    instance_key("repo_dir", Kind.STRING, "where the image holds the repository", default="/testbed"),
    instance_key("test_timeout_s", Kind.NUMBER, "seconds for the test run in EVAL", default=600.0),
    *(instance_key(name, (Kind.STRING, Kind.NULL), UNUSED) for name in ("hints_text", "created_at", "version",
                                                                 "environment_setup_commit")),
    *agent_task_keys(LIMITS),
), accepts_verl_rows=True)


@dataclass(frozen=True)
class SweTask:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    patch: str = ""
    repo_mirror: str | None = None
    image: str | None = None
    repo_dir: str = "/testbed"
    test_timeout_s: float = 600.0
    prompt: tuple[dict[str, Any], ...] | None = None

    @property
    def test_files(self) -> list[str]:
        return sorted({node.split("::", 1)[0] for node in (*self.fail_to_pass, *self.pass_to_pass)})


def swe_task(instance: dict[str, Any]) -> SweTask:
    fields = flatten(instance)
    prompt = prompt_messages(fields)
    missing = [k for k in ("instance_id", "base_commit", "test_patch") if not isinstance(fields.get(k), str) or not fields[k]]
    statement = first_text(fields, ("problem_statement",))
    if statement is None and prompt is None:
        missing.append("problem_statement")
    if missing:
        raise ValueError(f"a swe task needs {', '.join(missing)} (SWE-bench fields)")
    if not re.fullmatch(r"[0-9a-f]{7,40}", fields["base_commit"]):
        raise ValueError(f"base_commit {fields['base_commit']!r} is not a git commit id")
    fail_to_pass = string_list(fields.get("FAIL_TO_PASS"), "FAIL_TO_PASS")
    if not fail_to_pass:
        raise ValueError("FAIL_TO_PASS is empty: nothing would show that the issue is resolved")
    mirror, image = fields.get("repo_mirror"), optional_image(fields)
    if mirror is None and image is None:
        raise ValueError("say where the repository comes from: 'repo_mirror' (a local git mirror) "
                         "or 'image' (an image with the repository at 'repo_dir', default /testbed)")
    if mirror is not None and not (isinstance(mirror, str) and Path(mirror).is_absolute()):
        raise ValueError(f"'repo_mirror' must be an absolute path, got {mirror!r}")
    golden = fields.get("patch", "")
    return SweTask(
        instance_id=fields["instance_id"], repo=str(fields.get("repo", "")), base_commit=fields["base_commit"],
        problem_statement=statement or "", test_patch=fields["test_patch"], fail_to_pass=fail_to_pass,
        pass_to_pass=string_list(fields.get("PASS_TO_PASS"), "PASS_TO_PASS"),
        patch=golden if isinstance(golden, str) else "", repo_mirror=mirror, image=image,
        repo_dir=str(fields.get("repo_dir", SCHEMA.default("repo_dir"))),
        test_timeout_s=float(fields.get("test_timeout_s", SCHEMA.default("test_timeout_s"))),
        prompt=tuple(prompt) if prompt else None,
    )


def checkout_script(task: SweTask) -> str:
    """Shell that leaves /workspace/repo at base_commit with no later history: from the bundle
    `place_base` put in BASE_DIR (a mirror), else from the image's repo_dir."""
    base = shlex.quote(task.base_commit)
    if task.repo_mirror:
        source, commit = f"{BASE_DIR}/base.bundle", "task"
        gather = f"cat {BASE_DIR}/part.* > {BASE_DIR}/base.bundle && "
    else:
        source, commit, gather = shlex.quote(task.repo_dir), base, ""
    # No `set -e`: this runs in the agent's persistent shell, which must survive a failure.
    return (f"{gather}rm -rf {REPO} && git init -q {REPO} && git -C {REPO} fetch -q {source} {commit} && "
            f"git -C {REPO} checkout -q -b task FETCH_HEAD && rm -rf {BASE_DIR} && "
            f"printf '{EXCLUDES}' >> {REPO}/.git/info/exclude")


def bundle_script(task: SweTask) -> str:
    """Shell (in a sandbox with the mirror) that bundles base_commit's history, no later commit, in parts."""
    return (f"rm -rf /workspace/b /workspace/part.* && git init -q /workspace/b && "
            f"git -C /workspace/b fetch -q {MIRROR} {shlex.quote(task.base_commit)} && "
            f"git -C /workspace/b update-ref refs/heads/task FETCH_HEAD && "
            f"git -C /workspace/b bundle create /workspace/base.bundle task 2>/dev/null && "
            f"cd /workspace && split -a 4 -d -b {CHUNK_BYTES} base.bundle part. && rm -rf base.bundle b")


def patched_files(patch: str) -> list[str]:
    return sorted({b for _, b in PATCHED_FILE.findall(patch)})


def touched_files(patch: str) -> list[str]:
    """Both sides of every file a patch changes (a rename's old name too)."""
    return sorted({name for pair in PATCHED_FILE.findall(patch) for name in pair})


def files_to_restore(task: "SweTask", agent_patch: str) -> list[str]:
    """The test patch's files, and the test files and pytest configuration the agent's patch touched."""
    return sorted(set(patched_files(task.test_patch)) | {f for f in touched_files(agent_patch) if TEST_FILE.search(f)})


async def run_script(sandbox: "Sandbox", script: str, what: str, timeout: float = 300) -> str:
    result = await sandbox.bash(script, timeout=timeout)
    if result.exit_code != 0:
        raise RuntimeError(f"{what} failed (exit {result.exit_code}): {result.output[-800:]}")
    return result.output


class SweHandler(ToolAgentHandler):
    name: ClassVar[str] = "swe"
    instance_schema = SCHEMA
    reward_rule = RULE
    tools: ClassVar[tuple[str, ...]] = ("bash", "str_replace_editor", "think", "finish")
    limits: ClassVar[AgentLimits] = LIMITS

    def task(self, instance: dict[str, Any]) -> SweTask:
        return swe_task(instance)

    def messages(self, task: SweTask) -> list[dict[str, Any]]:
        if task.prompt is not None:
            return [dict(m) for m in task.prompt]
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Issue in {task.repo or 'the repository'}:\n\n{task.problem_statement}"}]

    def mirror_options(self, task: SweTask) -> dict[str, Any]:
        """The sandbox that bundles base_commit's history: the only one the mirror is bound into."""
        options = super().sandbox_options(task)
        if task.repo_mirror:
            options["binds"] = [f"{task.repo_mirror}:{MIRROR}:ro"]
        return options

    def sandbox_request(self, instance: dict[str, Any]) -> dict[str, Any]:
        return self.mirror_options(self.task(instance))   # the most any sandbox of the job asks for

    async def place_base(self, ctx: "JobContext", sandbox: "Sandbox", task: SweTask) -> None:
        """Put base_commit's history (a bundle, made beside the mirror) in `sandbox`, for checkout_script."""
        if not task.repo_mirror:
            return
        async with fresh_sandbox(ctx, **self.mirror_options(task)) as helper:
            await run_script(helper, bundle_script(task), f"bundling {task.base_commit} from the mirror")
            listed = await run_script(helper, "cd /workspace && ls part.*", "listing the bundle")
            for name in listed.split():
                part = await helper.download(f"/workspace/{name}")
                if part.error or part.content is None:
                    raise RuntimeError(f"fetching {name} of the bundle: {part.error}")
                await sandbox.upload(part.content, f"{BASE_DIR}/{name}")

    async def setup(self, ctx: "JobContext", sandbox: "Sandbox", task: SweTask) -> dict[str, Any]:
        await self.place_base(ctx, sandbox, task)
        await run_script(sandbox, checkout_script(task), f"checking out {task.base_commit}")
        await run_script(sandbox, f"cd {REPO}", "entering the repository")  # the agent starts there
        return {"repo": REPO}

    async def collect(self, ctx: "JobContext", sandbox: "Sandbox", run: AgentRun, task: SweTask) -> dict[str, Any]:
        await run_script(sandbox, f"cd {REPO} && git add -A && git diff --cached --binary "
                                  f"{shlex.quote(task.base_commit)} > /workspace/.agent.patch", "git diff")
        fetched = await sandbox.download("/workspace/.agent.patch")
        patch = fetched.content.decode("utf-8", "replace") if fetched.content is not None else ""
        (ctx.artifact_dir() / f"patch-{ctx.attempt}.diff").write_text(patch)
        return {"patch": patch, "patch_files": patched_files(patch)}

    def reference_result(self, task: SweTask, which: str) -> dict[str, Any]:
        if which == "golden" and not task.patch:
            raise ValueError("the task has no golden 'patch' to check")
        return {"patch": task.patch if which == "golden" else ""}

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        task = self.task(ctx.job.instance)
        patch = str(result.get("patch") or "")
        restored = files_to_restore(task, patch)
        async with fresh_sandbox(ctx, **self.sandbox_options(task)) as sandbox:
            await self.place_base(ctx, sandbox, task)
            await run_script(sandbox, checkout_script(task), f"checking out {task.base_commit}")
            if patch.strip():
                await sandbox.upload(patch.encode(), "/workspace/.swe/agent.patch")
                applied = await sandbox.bash(f"cd {REPO} && git apply --whitespace=nowarn /workspace/.swe/agent.patch",
                                             timeout=120)
                if applied.exit_code != 0:
                    return {"reward": 0.0, "resolved": False, "eval_error": f"the patch does not apply: {applied.output[-500:]}"}
            await sandbox.upload(task.test_patch.encode(), "/workspace/.swe/test.patch")
            restore = " ".join(shlex.quote(f) for f in restored)
            await run_script(sandbox, f"cd {REPO} && for f in {restore}; do git checkout -q {shlex.quote(task.base_commit)} "
                                      f"-- \"$f\" 2>/dev/null || rm -rf \"$f\"; done && git apply /workspace/.swe/test.patch",
                             "applying the test patch")
            spec = {"cwd": REPO, "timeout_s": task.test_timeout_s,
                    "args": ["-p", "no:cacheprovider", "-o", "junit_family=xunit1", "-q", *task.test_files]}
            ran, why = await run_runner(sandbox, "pytest", spec, task.test_timeout_s + 120)
        graded: dict[str, Any] = {"restored_files": restored}
        if ran is None:
            return {"reward": 0.0, "resolved": False, "eval_error": why, **graded}
        graded.update(pytest_exit=ran["exit_code"], pytest_timed_out=ran["timed_out"])
        try:
            found = statuses(ran["report"])
        except ElementTree.ParseError as exc:   # none, cut, or a second report written beside pytest's
            return {"reward": 0.0, "resolved": False, **graded,
                    "eval_error": f"pytest's JUnit report is not one XML document ({exc}): {ran['output'][-800:]}"}
        outcome = resolution(found, list(task.fail_to_pass), list(task.pass_to_pass))
        return {"reward": 1.0 if outcome.resolved and not ran["timed_out"] else 0.0, **outcome.to_json(), **graded}

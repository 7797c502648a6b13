"""The standard tools bound to a real bubblewrap sandbox: every editor command, the persistent
python, bash with its timeout and cut output, invalid calls as error outcomes."""

from __future__ import annotations

from orchestrator.agent import toolbox as toolbox_module
from orchestrator.agent.calls import ToolCall
from orchestrator.agent.toolbox import SandboxToolbox
from orchestrator.agent.tools import tool_specs
from orchestrator.spool.paths import SpoolPaths
from tests.agents.conftest import needs_bwrap
from tests.sandbox.helpers import with_sandbox

pytestmark = [needs_bwrap]


def test_every_tool_through_the_toolbox(spool: SpoolPaths) -> None:
    async def body(sandbox):  # type: ignore[no-untyped-def]
        box = SandboxToolbox(sandbox, tool_specs(["bash", "python", "str_replace_editor", "think", "submit", "finish"]),
                             max_output_chars=500)

        async def run(name: str, timeout: float = 20, **arguments: object):  # type: ignore[no-untyped-def]
            return await box.execute(ToolCall(name, dict(arguments)), timeout)

        edit = "str_replace_editor"
        out = {
            "create": await run(edit, command="create", path="a.py", file_text="x = 1\ny = 2\n"),
            "str_replace": await run(edit, command="str_replace", path="a.py", old_str="y = 2", new_str="y = 3"),
            "insert": await run(edit, command="insert", path="a.py", insert_line=0, new_str="# top"),
            "view": await run(edit, command="view", path="a.py", view_range=[1, 2]),
            "undo_edit": await run(edit, command="undo_edit", path="a.py"),
            "after_undo": await run("bash", command="cat a.py"),
            "bad_replace": await run(edit, command="str_replace", path="a.py", old_str="zzz", new_str=""),
            "py1": await run("python", code="import math\nvalue = math.factorial(5)"),
            "py2": await run("python", code="value + 1"),
            "py_error": await run("python", code="1 / 0"),
            "bash_cd": await run("bash", command="mkdir -p d && cd d && pwd"),
            "bash_pwd": await run("bash", command="pwd; exit 3"),
            "slow": await run("bash", timeout=1, command="sleep 30"),
            "long": await run("bash", command="seq 1 100000"),
            "think": await run("think", thought="plan"),
            "submit": await run("submit", answer="42"),
            "finish": await run("finish"),
            "unknown": await run("rm_rf"),
            "missing": await run("bash"),
        }
        return out

    out = with_sandbox(spool, body)
    assert out["create"].exit_code == 0 and "created" in out["create"].observation
    assert "replaced 1 occurrence" in out["str_replace"].observation
    assert out["view"].observation.split("\n") == ["     1\t# top", "     2\tx = 1"]
    assert out["after_undo"].observation.startswith("x = 1\ny = 3")   # the insert was undone
    assert out["bad_replace"].exit_code == 1 and "old_str not found" in out["bad_replace"].error
    assert out["py2"].observation == "121" and out["py2"].exit_code == 0
    assert out["py_error"].exit_code == 1 and "ZeroDivisionError" in out["py_error"].error
    assert out["bash_cd"].observation.startswith("/workspace/d") and out["bash_pwd"].observation.startswith("/workspace/d")
    assert out["bash_pwd"].exit_code == 3 and "[exit code 3]" in out["bash_pwd"].observation
    assert out["slow"].error == "timeout" and "timed out after 1 s" in out["slow"].observation
    long = out["long"]
    assert long.output_chars > 500_000 and len(long.observation) < 700 and "characters truncated" in long.observation
    assert long.observation.startswith("1\n2\n") and "100000" in long.observation
    assert out["think"].exit_code == 0 and not out["think"].ends_episode
    assert out["submit"].ends_episode and out["submit"].answer == "42" and out["finish"].ends_episode
    assert "unknown tool 'rm_rf'" in out["unknown"].error and out["unknown"].exit_code is None
    assert "missing required argument 'command'" in out["missing"].error


def test_a_call_the_sandbox_does_not_answer_in_time_is_interrupted(spool: SpoolPaths, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The host-side guard normally sits GUARD_MARGIN_S behind the sandbox's own timeout; moved
    # ahead of it, it stands for a server that does not answer: the call ends as an error
    # observation, the command is interrupted inside the sandbox, and the shell stays usable.
    monkeypatch.setattr(toolbox_module, "GUARD_MARGIN_S", -4.0)

    async def body(sandbox):  # type: ignore[no-untyped-def]
        box = SandboxToolbox(sandbox, tool_specs(["bash"]))
        hung = await box.execute(ToolCall("bash", {"command": "sleep 60"}), 5.0)
        after = await box.execute(ToolCall("bash", {"command": "echo still here"}), 20)
        return hung, after

    hung, after = with_sandbox(spool, body)
    assert hung.error == "timeout" and "did not answer within 5 s and was interrupted" in hung.observation
    assert after.exit_code == 0 and after.observation.startswith("still here")

"""The editor and file tools, including their failure cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.spool.paths import SpoolPaths
from tests.sandbox.helpers import needs_bwrap, with_sandbox

pytestmark = needs_bwrap


def test_view_create_replace_insert_undo(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["create"] = await sb.edit("create", "src/app.py", file_text="a = 1\nb = 2\nc = 3\n")
        out["range"] = await sb.edit("view", "src/app.py", view_range=[2, 3])
        out["replace"] = await sb.edit("str_replace", "src/app.py", old_str="b = 2", new_str="b = 20")
        out["insert"] = await sb.edit("insert", "src/app.py", insert_line=1, new_str="# after a")
        out["after"] = (await sb.download("src/app.py")).content
        out["undo"] = await sb.edit("undo", "src/app.py")
        out["undone"] = (await sb.download("src/app.py")).content
        out["dir"] = await sb.edit("view", "src")
        return out

    out = with_sandbox(spool, body)
    assert out["create"].ok
    assert out["range"].output == "     2\tb = 2\n     3\tc = 3"
    assert out["replace"].ok and "line 2" in out["replace"].output
    assert out["after"] == b"a = 1\n# after a\nb = 20\nc = 3\n"
    assert out["undone"] == b"a = 1\nb = 20\nc = 3\n"
    assert out["dir"].output == "app.py"


def test_editor_failures_are_results(spool: SpoolPaths) -> None:
    async def body(sb: Any) -> list[Any]:
        await sb.edit("create", "f.txt", file_text="x\nx\ny\n")
        return [
            await sb.edit("str_replace", "f.txt", old_str="x", new_str="z"),
            await sb.edit("str_replace", "f.txt", old_str="absent", new_str="z"),
            await sb.edit("view", "missing.txt"),
            await sb.edit("view", "f.txt", view_range=[3, 9]),
            await sb.edit("insert", "f.txt", insert_line=99, new_str="q"),
            await sb.edit("undo", "never-edited.txt"),
            await sb.edit("fly", "f.txt"),
        ]

    ambiguous, absent, missing, bad_range, bad_line, no_undo, unknown = with_sandbox(spool, body)
    assert "occurs 2 times" in ambiguous.error and "lines 1, 2" in ambiguous.error
    assert "not found" in absent.error
    assert "does not exist" in missing.error
    assert "outside the file" in bad_range.error
    assert "insert_line must be between 0 and 4" in bad_line.error
    assert "no edit" in no_undo.error
    assert "unknown editor command" in unknown.error


def test_upload_and_download_roundtrip(spool: SpoolPaths, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 1000
    source = tmp_path / "tool.sh"
    source.write_text("#!/bin/sh\necho tool-ran\n")
    source.chmod(0o755)

    async def body(sb: Any) -> list[Any]:
        return [
            await sb.upload(payload, "data/blob.bin"),
            await sb.upload(source, "/tmp/tool.sh"),
            await sb.bash("/tmp/tool.sh && sha256sum data/blob.bin | cut -c1-16"),
            await sb.download("data/blob.bin", tmp_path / "back.bin"),
            await sb.download("/nope/missing"),
            await sb.upload(b"x", "/usr/not-writable"),
        ]

    up, up_exec, ran, down, missing, denied = with_sandbox(spool, body)
    import hashlib

    assert up.ok and up.data["size"] == len(payload)
    assert ran.output == "tool-ran\n" + hashlib.sha256(payload).hexdigest()[:16] + "\n"
    assert down.content == payload and (tmp_path / "back.bin").read_bytes() == payload
    assert missing.error and "No such file" in missing.error
    assert denied.error and "Read-only" in denied.error

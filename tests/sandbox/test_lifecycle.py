"""Lifecycle: close leaves nothing, 50 at once, SIGKILLed owners swept, attach from elsewhere."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from orchestrator.spool.paths import SpoolPaths
from orchestrator.sandbox import loopback
from orchestrator.sandbox.start import attach_sandbox, start_sandbox, sweep_orphaned_sandboxes
from orchestrator.sandbox.errors import SandboxAttachError, SandboxClosedError, SandboxConfigError
from orchestrator.sandbox.records import SandboxRecord, sandboxes_dir
from tests.sandbox.helpers import needs_bwrap, run, sandbox_processes, started

pytestmark = needs_bwrap
REPO = Path(__file__).resolve().parents[2]


def test_close_is_verified_idempotent_and_releases_everything(spool: SpoolPaths, private_runtime: Path) -> None:
    async def scenario() -> tuple[Any, Any]:
        sb = await started(spool)
        await sb.bash("sleep 300 &")
        record = sb.record
        assert all(p.alive() for p in record.processes())
        await sb.close()
        await sb.close()
        with pytest.raises(SandboxClosedError):
            await sb.bash("true")
        return record, sb

    record, _ = run(scenario())
    assert not any(p.alive() for p in record.processes())
    assert not Path(record.runtime_dir).exists()
    assert loopback.leased() == []
    assert sandbox_processes(private_runtime) == []


def test_fifty_concurrent_sandboxes_unique_addresses_no_orphans(spool: SpoolPaths, private_runtime: Path) -> None:
    async def one(index: int) -> str:
        sb = await start_sandbox("bwrap", job_id=f"c-{index:06d}-000", paths=spool)
        try:
            result = await sb.bash("echo $HPC_ROLLOUT_LOOPBACK")
            assert result.output.strip() == sb.loopback
            return result.output.strip()
        finally:
            await sb.close()

    async def scenario() -> tuple[list[str], list[str]]:
        addresses = await asyncio.gather(*(one(i) for i in range(50)))
        return list(addresses), loopback.leased()

    addresses, still_leased = run(scenario())
    assert len(set(addresses)) == 50
    assert all(a.startswith("127.") and not a.startswith("127.0.") for a in addresses)
    assert still_leased == []
    assert list(sandboxes_dir().iterdir()) == []
    assert sandbox_processes(private_runtime) == []


def test_cancelled_start_leaves_nothing(spool: SpoolPaths, private_runtime: Path) -> None:
    async def scenario() -> None:
        for delay in (0.0, 0.002, 0.005, 0.01, 0.02, 0.04):
            task = asyncio.create_task(started(spool))
            await asyncio.sleep(delay)
            task.cancel()
            try:
                sb = await task
            except asyncio.CancelledError:
                continue
            await sb.close()

    run(scenario())
    assert sandbox_processes(private_runtime) == []
    assert list(sandboxes_dir().iterdir()) == [] and loopback.leased() == []


OWNER_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from orchestrator.spool.paths import SpoolPaths
    from orchestrator.sandbox.start import start_sandbox

    async def main():
        sb = await start_sandbox("bwrap", job_id="k-000001-000", paths=SpoolPaths.of(sys.argv[1]))
        await sb.bash("(sleep 600 &) ; setsid sleep 600 & echo started")
        print(json.dumps(sb.descriptor()), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def _spawn_owner(spool: SpoolPaths) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER_SCRIPT, str(spool.root)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert owner.stdout is not None
    descriptor = json.loads(owner.stdout.readline())
    return owner, descriptor


def test_sigkilled_worker_leaves_no_sandbox_after_sweep(spool: SpoolPaths, private_runtime: Path) -> None:
    owner, descriptor = _spawn_owner(spool)
    record = SandboxRecord.load(descriptor["runtime_dir"])
    assert all(p.alive() for p in record.processes())
    owner.kill()
    owner.wait()
    assert sweep_orphaned_sandboxes() == 1
    assert not any(p.alive() for p in record.processes())
    assert sandbox_processes(private_runtime) == []
    assert not Path(descriptor["runtime_dir"]).exists() and loopback.leased() == []
    assert sweep_orphaned_sandboxes() == 0


def test_sweep_kills_live_sandbox_of_dead_owner(spool: SpoolPaths, private_runtime: Path) -> None:
    """Without relying on --die-with-parent: the record says the owner is gone, the sweep kills."""
    dead = subprocess.Popen(["true"])
    dead.wait()

    async def scenario() -> SandboxRecord:
        sb = await started(spool)
        from dataclasses import replace

        orphan = replace(sb.record, owner=[dead.pid, 1])
        orphan.save()
        return orphan

    orphan = run(scenario())
    assert all(p.alive() for p in orphan.processes())
    assert sweep_orphaned_sandboxes() == 1
    assert not any(p.alive() for p in orphan.processes())
    assert sandbox_processes(private_runtime) == []


def test_attach_from_another_process(spool: SpoolPaths) -> None:
    script = textwrap.dedent("""
        import asyncio, json, sys
        from orchestrator.sandbox.start import attach_sandbox

        async def main():
            sb = await attach_sandbox(json.loads(sys.stdin.read()))
            print((await sb.bash("echo $STATE from $HPC_ROLLOUT_JOB_ID")).output, end="")

        asyncio.run(main())
    """)

    async def scenario() -> str:
        sb = await started(spool)
        try:
            await sb.bash("export STATE=kept")
            other = await asyncio.create_subprocess_exec(
                sys.executable, "-c", script, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            out, _ = await other.communicate(json.dumps(sb.descriptor()).encode())
            assert "secret" not in json.dumps(sb.descriptor())
            return out.decode()
        finally:
            await sb.close()

    assert run(scenario()) == "kept from t-000001-000\n"


def test_attach_refuses_closed_or_foreign_sandboxes(spool: SpoolPaths) -> None:
    async def scenario() -> None:
        sb = await started(spool)
        descriptor = sb.descriptor()
        await sb.close()
        with pytest.raises(SandboxAttachError, match="closed or reaped"):
            await attach_sandbox(descriptor)
        with pytest.raises(SandboxAttachError, match="lives on node"):
            await attach_sandbox({**descriptor, "node": "elsewhere"})

    run(scenario())


def test_wall_clock_limit_ends_the_sandbox(spool: SpoolPaths) -> None:
    async def scenario() -> None:
        sb = await started(spool, wall_clock_s=1)
        await sb.bash("sleep 300 &")
        await asyncio.sleep(1.5)
        with pytest.raises(SandboxClosedError):
            await sb.bash("true")
        await sb.close()

    run(scenario())


def test_wrong_secret_is_refused(spool: SpoolPaths) -> None:
    from orchestrator.sandbox.client import ExecClient

    async def scenario() -> None:
        sb = await started(spool)
        try:
            with pytest.raises(SandboxClosedError, match="authentication failed"):
                await ExecClient(sb.record.socket, "0" * 32).call("bash", {"command": "id"})
        finally:
            await sb.close()

    run(scenario())


def test_options_are_checked_with_helpful_errors(spool: SpoolPaths, tmp_path: Path) -> None:
    image_file = tmp_path / "image.sif"
    image_file.write_text("not a directory")
    cases = [
        ({"runtime": "docker"}, "choose one of auto, apptainer, bwrap, local"),
        ({"colour": "red"}, "valid: "),
        ({"limits": {"memory_mb": 1}}, r"outside \[64"),
        ({"limits": {"ram": 1}}, "unknown sandbox limit"),
        ({"image": str(tmp_path / "missing")}, "image build"),
        ({"image": str(image_file)}, "--format dir"),
        ({"binds": ["/nonexistent-dir:/x"]}, "does not exist"),
    ]

    async def scenario() -> None:
        for options, message in cases:
            runtime = options.pop("runtime", "bwrap")
            with pytest.raises(SandboxConfigError, match=message):
                await start_sandbox(runtime, job_id="e-000001-000", paths=spool, **options)

    run(scenario())
    assert list(sandboxes_dir().iterdir()) == []


def test_binds_and_image_directory(spool: SpoolPaths, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("from host\n")
    out = tmp_path / "out"
    out.mkdir()

    async def scenario() -> list[Any]:
        sb = await started(spool, binds=[f"{data}:/data", f"{out}:/out:rw"])
        try:
            return [await sb.bash("cat /data/in.txt"), await sb.bash("touch /data/x"),
                    await sb.bash("echo w > /out/y")]
        finally:
            await sb.close()

    read, denied, wrote = run(scenario())
    assert read.output == "from host\n" and denied.exit_code != 0 and wrote.exit_code == 0
    assert (out / "y").read_text() == "w\n"


def test_local_runtime_warns_and_runs_on_host(spool: SpoolPaths, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> Any:
        sb = await start_sandbox("local", job_id="l-000001-000", paths=spool)
        try:
            return await sb.bash("pwd; echo $HOME")
        finally:
            await sb.close()

    result = run(scenario())
    [workspace] = spool.job_dir("l-000001-000").glob("workspace.*")  # fresh for each sandbox
    assert result.output == f"{workspace}\n{workspace}\n"
    assert any("WITHOUT isolation" in r.message for r in caplog.records)


def test_directory_image_is_the_root_read_only(spool: SpoolPaths, tmp_path: Path) -> None:
    """An image directory (here: host /usr hard-linked, a private /etc) becomes the sandbox's /."""
    image = tmp_path / "image"
    image.mkdir()
    import subprocess as sp

    sp.run(["cp", "-al", "/usr", str(image / "usr")], check=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        (image / name).symlink_to(f"usr/{name}")
    (image / "etc").mkdir()
    (image / "etc" / "image-marker").write_text("from the image\n")
    (image / "proc").mkdir()      # skipped: the sandbox gets its own

    async def scenario() -> list[Any]:
        sb = await started(spool, image=str(image))
        try:
            return [await sb.bash("cat /etc/image-marker; ls /etc; ls -d /workspace /tmp | cat"),
                    await sb.bash("touch /etc/x"), await sb.python("6 * 7")]
        finally:
            await sb.close()

    listing, denied, python = run(scenario())
    assert listing.output == "from the image\nimage-marker\n/tmp\n/workspace\n", listing
    assert denied.exit_code != 0 and "Read-only" in denied.output
    assert python.result == "42"


def test_close_kills_a_hung_server(spool: SpoolPaths, private_runtime: Path) -> None:
    """Graceful stop impossible (server stopped): close falls back to SIGKILL of pid 1."""

    async def scenario() -> SandboxRecord:
        sb = await started(spool)
        pid1 = sb.record.child[0]
        with open(f"/proc/{pid1}/task/{pid1}/children") as fh:
            server = int(fh.read().split()[0])
        os.kill(server, signal.SIGSTOP)
        await sb.close()
        return sb.record

    record = run(scenario())
    assert not any(p.alive() for p in record.processes())
    assert sandbox_processes(private_runtime) == [] and not Path(record.runtime_dir).exists()


def test_runtime_failure_is_reported_with_its_message(spool: SpoolPaths, private_runtime: Path) -> None:
    from orchestrator.sandbox.errors import SandboxStartError

    async def scenario() -> None:
        with pytest.raises(SandboxStartError, match="Can't mkdir /proc/sys/x"):
            await started(spool, binds=["/tmp:/proc/sys/x"])

    run(scenario())
    assert list(sandboxes_dir().iterdir()) == [] and loopback.leased() == []


def test_local_runtime_hung_server_leaves_no_tools(spool: SpoolPaths) -> None:
    """No pid namespace under `local`: killing a hung server must still reach its shell."""

    async def scenario() -> tuple[int, int, int]:
        sb = await start_sandbox("local", job_id="l-000002-000", paths=spool)
        shell_pid = int((await sb.bash("echo $$")).output)
        job_pid = int((await sb.bash("sleep 300 >/dev/null & echo $!")).output.split()[-1])
        os.kill(sb.record.process[0], signal.SIGSTOP)
        await sb.close()
        return shell_pid, job_pid, sb.record.process[0]

    from orchestrator.process_start import start_time

    for pid in run(scenario()):
        assert start_time(pid) is None, pid


def test_sweep_spares_a_sandbox_being_closed_but_reaps_a_crashed_one(spool: SpoolPaths) -> None:
    from orchestrator.sandbox.process import CLOSING_MARK, kill_processes, wait_gone

    async def scenario() -> tuple[Any, Any]:
        closing, crashed = await started(spool, job_id="a-1"), await started(spool, job_id="b-1")
        for sb in (closing, crashed):
            kill_processes(sb.record)
            assert await wait_gone(sb.record.processes(), 5)
        Path(closing.record.runtime_dir, CLOSING_MARK).touch()   # as close() does first
        return closing, crashed

    closing, crashed = run(scenario())
    assert sweep_orphaned_sandboxes() == 1
    assert Path(closing.record.runtime_dir).exists() and not Path(crashed.record.runtime_dir).exists()
    run(closing.close())
    assert not Path(closing.record.runtime_dir).exists()

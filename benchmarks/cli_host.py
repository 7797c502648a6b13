"""A CLI of the `harness` image run on this host, the way the `harness` handler runs it in a sandbox:
its preset's environment and files (handlers/harness_clis.py) under a home directory of its own,
its command line through the job's relay. For benchmarks.proxy (merge ratios per harness) and
tests/proxy/test_cli_traffic.py; in a network namespace of its own (`unshare -rn`) it reaches
nothing but the proxy's socket.

The binaries are the image's own: Claude Code's native binary and Codex's static (musl) binary.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from hpc_rollout.handlers.harness_clis import HARNESS_DIR, PRESETS, CliSettings

BINARIES = {"claude-code": "@anthropic-ai/claude-code/bin/claude.exe",
            "codex": "@openai/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"}


@dataclass(frozen=True)
class HostRun:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


def prepare(cli: str, image: Path, home: Path, task: str, proxy_dir: Path, settings: CliSettings, *,
            switches: bool = True, trace: Path | None = None) -> HostRun:
    """`cli` on `task` through the relay of `proxy_dir`, in a new network namespace; `switches`:
    keep the preset's DISABLE_* settings; `trace`: run under strace (connect and sendto) into it."""
    preset = PRESETS[cli]
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / preset.command(settings).split()[0]).symlink_to(image / "usr/local/lib/node_modules" / BINARIES[cli])
    env = {k: v.replace(HARNESS_DIR, str(home)) for k, v in preset.env(settings).items()
           if switches or "DISABLE" not in k}
    for path, text in preset.files(settings).items():
        target = Path(path.replace(HARNESS_DIR, str(home)))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (home / "task.md").write_text(task)
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", HOME=str(home), LANG="C.UTF-8", HPC_ROLLOUT_TASK_FILE=str(home / "task.md"))
    command = (f"python3 -I {proxy_dir}/relay.py --dir {proxy_dir} --host 127.0.0.1 -- "
               f"bash -c {shlex.quote(preset.command(settings))}")
    if trace is not None:
        command = f"strace -f -qq -e trace=connect,sendto -o {trace} {command}"
    return HostRun(["unshare", "-rn", "bash", "-c", f"ip link set lo up 2>/dev/null; {command}"], env, home)

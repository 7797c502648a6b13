"""`serve-llm`: the reference server's command, runnable without the rest of the CLI.

`hpc-rollout serve-llm` registers this command; `python -m orchestrator.cli.serve_llm` runs
it directly (what local_server does, so a server starts even while other CLI areas change).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import click

from orchestrator.cli.exit_codes import ExitCode


@click.command("serve-llm")
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="A local Hugging Face model directory.")
@click.option("--tiny", is_flag=True, help="Serve the tiny random model (built offline and cached on first use).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="0 picks a free port (printed on the first line).")
@click.option("--record", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append every request's prompt ids, sampled ids and logprobs to this JSONL file.")
@click.option("--max-model-len", type=click.IntRange(min=16), default=2048, show_default=True)
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests sampled together at most (continuous batching: a request joins at the next step).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads.")
@click.option("--weight-version", default="0", show_default=True, help="Reported by /model_info and /generate.")
@click.option("--scripted", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Answer with predetermined completions from this JSON/JSONL file (rendered to ids by "
                   "the model's tokenizer; no weights are loaded). See orchestrator/devserver/scripted.py.")
@click.option("--logprobs-mode", type=click.Choice(["raw", "processed"]), default=None,
              help="Logprobs of every endpoint: raw (log_softmax of the logits) or processed (after "
                   "temperature), announced in /v1/models so `backend add` records it. Default: each "
                   "endpoint as its stock server (/v1/completions raw like vLLM, /generate processed like SGLang).")
@click.option("--reload-delay-s", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="A weight reload holds generation this many seconds more once the running batch has "
                   "drained: the load time of a large model, for benchmarks of weight swaps (benchmarks/rolling.py).")
@click.option("--legacy-vllm", is_flag=True, hidden=True,
              help="Answer like vLLM < 0.10.2 (no token_ids), to exercise the client's fallback.")
def serve_llm(model_dir: Path | None, tiny: bool, host: str, port: int, record: Path | None,
              max_model_len: int, max_batch: int, threads: int | None, weight_version: str,
              scripted: Path | None, logprobs_mode: str | None, reload_delay_s: float, legacy_vllm: bool) -> None:
    """A reference LLM server speaking vLLM's token-in/token-out protocol (and SGLang's /generate).

    \b
      hpc-rollout serve-llm --tiny --port 8000 &
      hpc-rollout backend add spool/run1 http://127.0.0.1:8000/v1
      hpc-rollout serve-llm --tiny --scripted replies.jsonl --port 0   # a scripted policy
      hpc-rollout serve-llm --tiny --logprobs-mode processed --port 0   # verl's rollout default
    It serves until Ctrl-C, SIGTERM or SIGHUP, then closes and exits 130 (interrupted).
    """
    if tiny == (model_dir is not None):
        raise click.UsageError("give exactly one of --model DIR or --tiny")
    require_torch("serve-llm")
    if model_dir is not None:
        check_model_dir(model_dir)
    check_port_free(host, port)  # before seconds of loading, not after
    import asyncio   # here, not at start-up: `hpc-rollout` imports this module for every command

    from orchestrator.devserver.server import ServerOptions, serve
    from orchestrator.devserver.tiny_model import tiny_model_dir

    directory = tiny_model_dir() if tiny else model_dir
    assert directory is not None
    options = ServerOptions(
        model_dir=directory.absolute(), host=host, port=port, record=record,
        max_model_len=max_model_len, max_batch=max_batch, threads=threads,
        weight_version=weight_version, legacy_vllm=legacy_vllm, logprobs_mode=logprobs_mode,
        scripted=scripted.absolute() if scripted else None, reload_delay_s=reload_delay_s,
    )
    asyncio.run(serve(options))
    sys.exit(ExitCode.INTERRUPTED)   # it serves until a signal stops it: 130, as any interrupted command


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def require_torch(command: str) -> None:
    """A one-line error naming the extra when torch cannot be imported (clusters bring their own build)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise click.ClickException(
            f"{command} needs torch, which is not installed: pip install 'hpc-rollout[llm]' "
            "(PyPI's torch: the CUDA build on Linux x86_64, several GB), or for CPU only first "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu"
        ) from None


def check_model_dir(directory: Path) -> None:
    missing = [name for name in ("config.json",) if not (directory / name).is_file()]
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"a tokenizer ({' or '.join(TOKENIZER_FILES)})")
    if missing:
        raise click.ClickException(
            f"--model {directory} has no {', no '.join(missing)}: point it at a Hugging Face model directory "
            "(save_pretrained of the model and of its tokenizer), or use --tiny"
        )


def check_port_free(host: str, port: int) -> None:
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise click.ClickException(
                f"port {port} on {host} is not free ({exc.strerror}): pick another with --port N, "
                "or --port 0 for any free one (printed on the first line)"
            ) from None


if __name__ == "__main__":
    serve_llm(prog_name="python -m orchestrator.cli.serve_llm")

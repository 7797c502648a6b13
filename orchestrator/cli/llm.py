"""`hpc-rollout backend ...` (the LLM backend registry) and `hpc-rollout serve-llm`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.run_dir import RUN_DIR_PATH_TYPE
from orchestrator.llm.errors import LLMError
from orchestrator.llm.registry import BackendRegistry, BackendState, Protocol, Snapshot, normalize_url
from orchestrator.cli.serve_llm import serve_llm
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import open_run

if TYPE_CHECKING:
    from orchestrator.llm.weights import SwapReport

RUN_DIR = click.argument("run_dir", type=RUN_DIR_PATH_TYPE)
PROTOCOL = click.option("--protocol", type=click.Choice([p.value for p in Protocol]), default="vllm",
                        show_default=True, help="vllm: /v1/completions; sglang: native /generate.")
MODEL = click.option("--model", default=None, help="Served model id (default: first of GET /v1/models).")
TOKENIZER = click.option("--tokenizer", default=None,
                         help="Local tokenizer directory (default: the model id when it is a directory).")


def registry_of(run_dir: Path) -> BackendRegistry:
    """The registry of a run directory (one with run.toml), or ConfigError saying how to make one."""
    paths, _ = open_run(run_dir)   # the run's modes for what the command writes, its owners trusted
    return BackendRegistry.of(paths)


def fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


@click.group("backend")
def backend() -> None:
    """The LLM backends of a run (backends.json in the run directory).

    \b
      hpc-rollout backend add spool/run1 http://node17:8000/v1 --version 3
      hpc-rollout backend list spool/run1
      hpc-rollout backend swap spool/run1 --version 4 http://node17:8000/v1 http://node18:8000/v1
      hpc-rollout backend swap spool/run1 --reload ckpt/step-4 --version 4
    """


@backend.command("add")
@RUN_DIR
@click.argument("url")
@PROTOCOL
@MODEL
@TOKENIZER
@click.option("--version", "version", type=click.IntRange(min=0), default=None,
              help="Policy version served (default: the registry's current one).")
@click.option("--node", default=None, help="Node the server runs on (default: the URL's host).")
@click.option("--check", is_flag=True, help="Refuse to add a URL whose GET /health does not answer 200.")
@click.option("--logprob-mode", default=None, metavar="raw|processed",
              help="The logprobs the server returns: raw (vLLM's default) or processed (after temperature: "
                   "SGLang, vLLM --logprobs-mode processed_logprobs, verl's rollout default). Default: what "
                   "the server announces in /v1/models, else the protocol's default.")
def add(run_dir: Path, url: str, protocol: str, model: str | None, tokenizer: str | None,
        version: int | None, node: str | None, check: bool, logprob_mode: str | None) -> None:
    """Register the server at URL (replaces an entry with the same URL).

    \b
    Examples:
      hpc-rollout backend add spool/run1 http://node17:8000/v1 --version 3
      hpc-rollout backend add spool/run1 http://node18:30000 --protocol sglang --check

    A URL that does not answer GET /health is added with a warning (workers mark it down until
    it answers); with --check it is refused. The kind of logprobs it returns is recorded with
    it (every row's turns carry it): --logprob-mode, else what the server says, else the
    protocol's default. A corrupt registry is moved to quarantine/ (with the reason) and a
    new one started: this rebuilds it.
    """
    from orchestrator.llm.logprob_mode import resolve_logprob_mode

    registry = registry_of(run_dir)
    try:
        problem = health_problem_now(normalize_url(url))
        if problem and check:
            raise click.ClickException(f"{url} does not answer ({problem}); not added (--check): start the "
                                       "server first, or add it without --check to route to it once it answers")
        mode, source = resolve_logprob_mode(normalize_url(url), protocol, logprob_mode, ask=problem is None)
        entry = registry.add(url, protocol=protocol, model=model, tokenizer=tokenizer, version=version, node=node,
                             logprob_mode=mode)
    except LLMError as exc:
        raise fail(exc) from None
    click.echo(f"added {entry.url} ({entry.protocol.value}, node {entry.node}, version {entry.policy_version}, "
               f"{mode.value} logprobs: {source})")
    if problem:
        click.echo(f"warning: {entry.url} does not answer yet ({problem}); workers mark it down and probe it "
                   "until it does (use --check to refuse such URLs)", err=True)


def health_problem_now(url: str) -> str | None:
    """None when GET /health answers 200 within 2 s, else what went wrong."""
    import asyncio

    from orchestrator.llm.http import BackendHttp
    from orchestrator.llm.registry import Backend
    from orchestrator.llm.router import HEALTH_TIMEOUT_S, health_problem

    async def ask() -> str | None:
        async with BackendHttp(timeout_s=HEALTH_TIMEOUT_S) as http:
            return await health_problem(http, Backend(url))

    return asyncio.run(ask())


@backend.command("remove")
@RUN_DIR
@click.argument("url")
def remove(run_dir: Path, url: str) -> None:
    """Unregister URL: no new task goes there; tasks already on it finish.

    \b
    Example:
      hpc-rollout backend remove spool/run1 http://node17:8000/v1
    """
    try:
        entry = registry_of(run_dir).remove(url)
    except LLMError as exc:
        raise fail(exc) from None
    click.echo(f"removed {entry.url}")


@backend.command("clear")
@RUN_DIR
@click.option("--force", is_flag=True, help="Also replace a corrupt registry (kept in quarantine/ with the reason).")
def clear(run_dir: Path, force: bool) -> None:
    """Unregister every backend (the policy version is kept).

    \b
    Examples:
      hpc-rollout backend clear spool/run1
      hpc-rollout backend clear spool/run1 --force     # also replaces a corrupt backends.json
    """
    registry = registry_of(run_dir)
    try:
        if not force:
            registry.read()  # a corrupt file is an error unless --force
        count = registry.clear()
    except LLMError as exc:
        raise fail(exc) from None
    click.echo(f"cleared {count} backend(s)")


@backend.command("swap")
@RUN_DIR
@click.argument("urls", nargs=-1)
@click.option("--version", "version", type=click.IntRange(min=0), default=None,
              help="New policy version (default: current + 1).")
@click.option("--reload", "checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Keep the backends: ask each to load the weights in this checkpoint directory while "
                   "running; the version moves only when all have confirmed.")
@click.option("--max-policy-lag", type=click.IntRange(min=-1), default=None,
              help="With --reload: samples older than version - lag are stale (default: run.toml "
                   "[trainer] max_policy_lag; -1 none).")
@click.option("--abort/--no-abort", "abort", default=None,
              help="With --reload: first abort the generations in flight; their jobs resume them on the new "
                   "weights (default: on when run.toml [trainer] staleness is continue).")
@click.option("--rolling", is_flag=True,
              help="With --reload: reload in waves, keeping at least --min-serving of the backends serving "
                   "(each wave is drained first; needs max_policy_lag >= 1).")
@click.option("--min-serving", type=click.FloatRange(0, 1, max_open=True), default=0.5, show_default=True,
              help="With --rolling: the share of the up backends that keeps serving (at least one).")
@PROTOCOL
@MODEL
@TOKENIZER
def swap(run_dir: Path, urls: tuple[str, ...], version: int | None, checkpoint: Path | None,
         max_policy_lag: int | None, protocol: str, model: str | None, tokenizer: str | None,
         abort: bool | None = None, rolling: bool = False, min_serving: float = 0.5) -> None:
    """Move to a new policy: replace the backend set with URLS, or --reload a checkpoint on every backend.

    \b
      hpc-rollout backend swap spool/run1 --version 4 http://node17:8000/v1 http://node18:8000/v1
      hpc-rollout backend swap spool/run1 --reload ckpt/step-4 --version 4
      hpc-rollout backend swap spool/run1 --reload ckpt/step-4 --version 4 --rolling --max-policy-lag 1
    """
    try:
        if checkpoint is not None:
            if urls:
                raise click.UsageError("give URLS (a new backend set) or --reload CKPT (the same backends), not both")
            report = reload_and_swap(run_dir, checkpoint, version, max_policy_lag, abort, rolling, min_serving)
            click.echo(f"policy version {report.version}: {len(report.reloaded)} backend(s) loaded "
                       f"{report.checkpoint} in {report.seconds:.2f} s"
                       + (f", in {len(report.waves)} waves" if report.waves else ""))
            if report.aborted:
                counts = [n for n in report.aborted.values() if n is not None]
                click.echo(f"aborted the generations in flight on {len(report.aborted)} backend(s)"
                           + (f" ({sum(counts)} generation(s))" if counts else "") + "; their jobs resume them")
            for url in report.abort_unsupported:
                click.echo(f"{url} cannot abort generations (vLLM: start it with VLLM_SERVER_DEV_MODE=1); "
                           "its generations in flight finished on the old weights")
            for url in report.removed:
                click.echo(f"removed {url}: it was down and could not reload; restart it on the checkpoint and add it again")
            return
        if rolling:
            raise click.UsageError("--rolling goes with --reload CKPT (the same backends load new weights)")
        if not urls:
            raise click.UsageError("give the new backend URLS, or --reload CKPT to keep the backends")
        snapshot = registry_of(run_dir).swap(list(urls), version=version, protocol=protocol,
                                             model=model, tokenizer=tokenizer)
    except LLMError as exc:
        raise fail(exc) from None
    click.echo(f"policy version {snapshot.policy_version}: {len(snapshot.backends)} backend(s)")


def reload_and_swap(run_dir: Path, checkpoint: Path, version: int | None, max_policy_lag: int | None,
                    abort: bool | None = None, rolling: bool = False, min_serving: float = 0.5) -> "SwapReport":
    from orchestrator.config import RunConfig, Staleness
    from orchestrator.llm.weights import swap_weights

    paths = SpoolPaths.of(run_dir)
    trainer = RunConfig.load(paths.run_config).trainer
    max_policy_lag = trainer.max_policy_lag if max_policy_lag is None else max_policy_lag
    abort = Staleness.parse(trainer.staleness) is Staleness.CONTINUE if abort is None else abort
    target = registry_of(run_dir).read().policy_version + 1 if version is None else version
    return swap_weights(paths, checkpoint, target, max_policy_lag, abort, rolling, min_serving)


@backend.command("state")
@RUN_DIR
@click.argument("url")
@click.argument("state", type=click.Choice([s.value for s in BackendState]))
@click.option("--reason", default="set by hand", show_default=True)
def set_state(run_dir: Path, url: str, state: str, reason: str) -> None:
    """Set URL's state: `draining` takes no new tasks (a running one moves at its next turn), `up` re-enables it.

    \b
    Examples:
      hpc-rollout backend state spool/run1 http://node17:8000/v1 draining --reason "node maintenance"
      hpc-rollout backend state spool/run1 http://node17:8000/v1 up
    """
    try:
        entry = registry_of(run_dir).set_state(normalize_url(url), BackendState(state),
                                               "" if state == "up" else reason)
    except LLMError as exc:
        raise fail(exc) from None
    if entry is None:
        raise click.ClickException(f"no backend {url} in the registry: see `hpc-rollout backend list {run_dir}`")
    click.echo(f"{entry.url}: {entry.state.value}")


@backend.command("wait")
@click.argument("url")
@PROTOCOL
@MODEL
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds to wait for the first completed token.")
@click.option("--pid", type=click.IntRange(min=1), default=None,
              help="The server's process: stop waiting as soon as it exits.")
def wait(url: str, protocol: str, model: str | None, timeout_s: float, pid: int | None) -> None:
    """Wait until the server at URL completes one token (a real request, not only /health).

    \b
      hpc-rollout backend wait http://node17:8000/v1 --timeout 1800 --pid $server_pid
    """
    from orchestrator.llm.readiness import wait_until_serving

    try:
        url = normalize_url(url)
        completion = wait_until_serving(url, Protocol(protocol), model, timeout_s, pid)
    except LLMError as exc:
        raise fail(exc) from None
    click.echo(f"{url} is serving: 1 token in ({completion.output_ids[0]}, logprob {completion.logprobs[0]:.3f})")


@backend.command("list")
@RUN_DIR
@click.option("--json", "as_json", is_flag=True, help="Print the registry plus load as JSON.")
@click.option("--lease", type=click.FloatRange(min=0.1), default=None,
              help="Seconds after which a silent worker's in-flight counts are ignored "
                   "(default: the run's lease from run.toml, else 30).")
def list_backends(run_dir: Path, as_json: bool, lease: float | None) -> None:
    """Backends with node, policy version, state and tasks in flight (all live workers).

    \b
    Examples:
      hpc-rollout backend list spool/run1
      hpc-rollout backend list spool/run1 --json | jq '.backends[].state'
    """
    from orchestrator.llm.inflight import read_load   # asyncio: loaded by the command that needs it
    from orchestrator.llm.router import run_lease_s   # aiohttp: likewise

    paths = SpoolPaths.of(run_dir)
    registry = registry_of(run_dir)
    try:
        snapshot = registry.read()
    except LLMError as exc:
        raise fail(exc) from None
    load = read_load(paths, run_lease_s(paths) if lease is None else lease)
    if as_json:
        data = snapshot.to_json()
        for entry in data["backends"]:
            entry["inflight"] = load.inflight.get(entry["url"], 0)
            entry["assigned"] = load.assigned.get(entry["url"], 0)
        click.echo(json.dumps(data, indent=2))
        return
    print_table(snapshot, load.inflight, load.assigned, load.live_workers)


def print_table(snapshot: Snapshot, inflight: dict[str, int], assigned: dict[str, int], workers: int) -> None:
    from rich.table import Table

    from orchestrator.cli.console import out

    table = Table(title=f"policy version {snapshot.policy_version} · {workers} live worker(s)")
    for column in ("url", "protocol", "node", "version", "state", "in flight", "assigned", "model"):
        table.add_column(column, justify="right" if column in ("version", "in flight", "assigned") else "left",
                         no_wrap=column in ("url", "in flight"))
    for b in snapshot.backends:
        state = b.state.value + (f" ({b.reason})" if b.reason else "")
        table.add_row(b.url, b.protocol.value, b.node, str(b.policy_version), state,
                      str(inflight.get(b.url, 0)), str(assigned.get(b.url, 0)), b.model or "-")
    if not snapshot.backends:
        click.echo("no backends registered: hpc-rollout backend add RUN_DIR URL")
        return
    out.print(table)


def register(cli: click.Group) -> None:
    cli.add_command(backend)
    cli.add_command(serve_llm)

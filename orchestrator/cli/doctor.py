"""`hpc-rollout doctor`: whether the run's filesystem can hold a spool, and with which lease."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import click
import orjson

from orchestrator.cli.console import Tone, say, styled, tell, warn
from orchestrator.cli.exit_codes import ExitCode
from orchestrator.cli.run_dir import RUN_DIR_TYPE
from orchestrator.config import ConfigError
from orchestrator.doctor.report import recommendation, verdicts, write_record
from orchestrator.doctor.run import meeting_dir, run_agents, run_on_slurm
from orchestrator.spool.fs_record import LEASE_DELAY
from orchestrator.spool.rundir import open_run


@click.command("doctor")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.option("--nodes", type=click.IntRange(1, 2), default=1, show_default=True,
              help="2: one agent on each of two Slurm nodes (one sbatch, waited for): how late one node sees "
                   "what another did, and their clock offset.")
@click.option("--agents-via", "agents_via", default=None, metavar="PREFIX",
              help="Start both agents through this command prefix instead (e.g. 'ssh node17'); two clients.")
@click.option("--agent-run-dir", default=None, type=click.Path(path_type=Path),
              help="RUN_DIR as the agents see it, when it is mounted elsewhere there (default: RUN_DIR).")
@click.option("--partition", default=None, help="Slurm partition for --nodes 2.")
@click.option("--account", default=None, help="Slurm account for --nodes 2.")
@click.option("--time", "time_limit", default="00:15:00", show_default=True, help="Slurm time limit for --nodes 2.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurement and verdicts as one JSON object.")
def doctor_cmd(run_dir: str, nodes: int, agents_via: str | None, agent_run_dir: Path | None, partition: str | None,
               account: str | None, time_limit: str, as_json: bool) -> None:
    """Measure what the spool relies on in RUN_DIR's filesystem, with a verdict per property.

    Two agents race claim renames, exclusive creates and directory-rename locks, try link() and
    fsync, and time how late one sees what the other did (a create, a rename, an unlink, a file
    replaced as a heartbeat is), over a TCP channel between them. Between two nodes the delays are
    recorded in RUN_DIR/control/filesystem.json: `launch` and the workers then refuse a lease too
    short for them, and the lease to use is printed.

    \b
    Examples:
      hpc-rollout doctor spool/run1                       # one node: atomicity and flushes
      hpc-rollout doctor /scratch/me/run1 --nodes 2 --partition debug   # two Slurm nodes
      hpc-rollout doctor /scratch/me/run1 --agents-via 'ssh node17'     # any two clients
    Exit status 1 when a property the spool relies on does not hold.
    """
    try:
        paths, config = open_run(run_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if nodes == 2 and agents_via:
        raise click.UsageError("--nodes 2 and --agents-via are two ways to start the agents: give one")
    meeting = meeting_dir(paths)
    agent_meeting = (agent_run_dir / meeting.relative_to(paths.root)) if agent_run_dir else meeting
    two_clients = nodes == 2 or agents_via is not None
    if not as_json:
        tell(f"measuring {paths.root} with two agents "
             f"{'on two Slurm nodes' if nodes == 2 else 'through ' + repr(agents_via) if agents_via else 'on this node'}"
             " (a minute or two; up to a few more where caches are long)")
    try:
        if nodes == 2:
            flags = [f"--time={time_limit}", *([f"--partition={partition}"] if partition else []),
                     *([f"--account={account}"] if account else [])]
            agents = run_on_slurm(paths, meeting, flags)
        else:
            agents = run_agents(meeting, agent_meeting, shlex.split(agents_via) if agents_via else [])
    finally:
        shutil.rmtree(meeting, ignore_errors=True)
    results = agents["watcher"]["results"]
    hosts = [agents["watcher"]["host"], agents["maker"]["host"]]
    found = verdicts(results, same_host=not two_clients)
    advice = recommendation(results, config.leases)
    fstype = str(agents["watcher"].get("filesystem") or "unknown")   # as the agents see it
    record = write_record(paths, results, hosts, fstype) if two_clients else None
    failed = [v for v in found if not v.ok]
    if as_json:
        click.echo(orjson.dumps({"filesystem": fstype, "hosts": hosts, "results": results,
                                 "verdicts": [{"name": v.name, "ok": v.ok, "detail": v.detail} for v in found],
                                 "recommended": advice, "record": str(record) if record else None}))
    else:
        say(f"filesystem: {fstype} (agents on {', '.join(dict.fromkeys(hosts))})")
        for verdict in found:
            mark = styled("ok  ", Tone.GOOD) if verdict.ok else styled("FAIL", Tone.ERROR)
            say(mark, f" {verdict.name}: {verdict.detail}")
        if two_clients:
            say(f"lease: another node saw a rewritten heartbeat {results.get(LEASE_DELAY)} s late; with "
                f"leases.heartbeat_s = {advice['heartbeat_s']:g} use leases.lease_s >= {advice['lease_s']:g} "
                f"(run.toml has {config.leases.lease_s:g}); recorded in {record}")
        else:
            warn("one node is one filesystem client: how late other nodes see changes is not measured here; "
                 f"run `hpc-rollout doctor {run_dir} --nodes 2` (or --agents-via 'ssh OTHER_NODE')")
    sys.exit(ExitCode.FAILED if failed else ExitCode.OK)


def register(cli: click.Group) -> None:
    cli.add_command(doctor_cmd)

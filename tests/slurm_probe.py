"""What the Slurm cluster here can do, for the tests that need one: probed once (sinfo, scontrol
show config / partition), then each test states its needs and is skipped, with a reason naming
them, when the cluster lacks one.

    @pytest.mark.slurm(nodes=4, preemption=True)      # in tests/slurm/: the slurm_cluster fixture reads it
    cluster = require(gpus_per_node=1)                # anywhere else

The project's own cluster (scripts/slurm-up.sh: 4 nodes, partitions debug and high, GPU gres,
MaxArraySize 8, accounting) has everything every test asks for. scripts/test.sh sets
HPC_ROLLOUT_SLURM_REQUIRED=1 once it has that cluster: then an unmet need (or no cluster at all)
fails instead of skipping, so in CI every Slurm test runs. Elsewhere (a user's laptop, root
without Slurm, a site's cluster of another shape) they skip.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass

import pytest

from orchestrator.slurm.cluster import parse_config, slurm_available

REQUIRED_ENV = "HPC_ROLLOUT_SLURM_REQUIRED"
START_HINT = "start one with `sudo SLURM_NODES=4 scripts/slurm-up.sh`"
# Node states that can run a test's tasks (busy is fine: a previous test's tasks may be ending).
USABLE_STATES = ("idle", "mix", "alloc", "comp", "mixed", "allocated", "completing")


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: frozenset[str]     # usable nodes
    default: bool
    priority_tier: int


@dataclass(frozen=True)
class Cluster:
    partitions: dict[str, Partition]
    cpus: dict[str, int]      # node -> CPUs
    gpus: dict[str, int]      # node -> GPUs (gres gpu)
    max_array_size: int
    preempt_type: str         # e.g. preempt/partition_prio
    preempt_mode: str         # e.g. REQUEUE
    accounting: bool          # sacct answers (slurmdbd)

    @property
    def default_partition(self) -> Partition:
        return next((p for p in self.partitions.values() if p.default), next(iter(self.partitions.values())))

    def partition(self, name: str | None) -> Partition | None:
        return self.default_partition if name is None else self.partitions.get(name)

    def preempting_partition(self, over: Partition) -> Partition | None:
        """A partition of a higher priority tier over the same nodes, when jobs there requeue others."""
        if "partition_prio" not in self.preempt_type or "REQUEUE" not in self.preempt_mode.upper():
            return None
        return next((p for p in self.partitions.values()
                     if p.priority_tier > over.priority_tier and over.nodes <= p.nodes), None)


@dataclass(frozen=True)
class Needs:
    """What one test needs of the cluster; `unmet` says which of it is missing."""

    nodes: int = 1                         # usable nodes in the partition
    partition: str | None = None           # None: the default partition
    gpus_per_node: int = 0                 # on `nodes` of its nodes
    cpus: int = 0                          # CPUs over the partition's usable nodes (shared tasks)
    max_array_size: tuple[int, int] | None = None   # (lowest, highest) MaxArraySize the test can use
    preemption: bool = False               # a higher-tier partition over these nodes that requeues
    accounting: bool = False               # sacct

    def unmet(self, cluster: Cluster) -> list[str]:
        partition = cluster.partition(self.partition)
        if partition is None:
            return [f"a partition {self.partition!r} (the cluster has {', '.join(cluster.partitions)})"]
        missing = []
        if len(partition.nodes) < self.nodes:
            missing.append(f"{self.nodes} usable nodes in partition {partition.name} (it has {len(partition.nodes)})")
        if self.gpus_per_node:
            with_gpus = [n for n in partition.nodes if cluster.gpus.get(n, 0) >= self.gpus_per_node]
            if len(with_gpus) < self.nodes:
                missing.append(f"gres gpu:{self.gpus_per_node} on {self.nodes} node(s) of {partition.name} "
                               f"(found on {len(with_gpus)})")
        if self.cpus and sum(cluster.cpus.get(n, 0) for n in partition.nodes) < self.cpus:
            missing.append(f"{self.cpus} CPUs in partition {partition.name} "
                           f"(it has {sum(cluster.cpus.get(n, 0) for n in partition.nodes)})")
        if self.max_array_size and not self.max_array_size[0] <= cluster.max_array_size <= self.max_array_size[1]:
            low, high = self.max_array_size
            missing.append(f"MaxArraySize between {low} and {high} (it is {cluster.max_array_size})")
        if self.preemption and cluster.preempting_partition(partition) is None:
            missing.append(f"a higher-PriorityTier partition over {partition.name}'s nodes with "
                           f"PreemptType=preempt/partition_prio and PreemptMode=REQUEUE "
                           f"(PreemptType={cluster.preempt_type}, PreemptMode={cluster.preempt_mode})")
        if self.accounting and not cluster.accounting:
            missing.append("accounting (sacct, slurmdbd)")
        return missing


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=15)


def _gpus(gres: str) -> int:
    """GPUs in sinfo's %G ("gpu:4", "gpu:a100:2(S:0-1)", "(null)")."""
    total = 0
    for item in gres.split(","):
        match = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if match:
            total += int(match.group(1))
    return total


@functools.cache
def probe() -> Cluster | str:
    """The cluster here, or why there is none (with how to start one)."""
    if not slurm_available():
        return f"no Slurm client on PATH: {START_HINT}"
    try:
        ping = _run("scontrol", "ping")
        if ping.returncode != 0 or "UP" not in ping.stdout:
            return f"the Slurm controller is down: {START_HINT}"
        nodes = _run("sinfo", "-h", "-N", "-o", "%N|%P|%t|%G|%c")
        partitions = _run("scontrol", "show", "partition", "-o")
        config = parse_config(_run("scontrol", "show", "config").stdout)
        accounting = _run("sacct", "-n", "-X", "-S", "now-1minutes", "-o", "JobID").returncode == 0
    except subprocess.TimeoutExpired:
        return "the Slurm controller does not answer within 15 s"
    usable: dict[str, set[str]] = {}
    default = ""
    cpus: dict[str, int] = {}
    gpus: dict[str, int] = {}
    for line in nodes.stdout.splitlines():
        node, partition, state, gres, node_cpus = line.split("|")
        if partition.endswith("*"):
            partition = default = partition.rstrip("*")
        usable.setdefault(partition, set())
        if state.rstrip("*~#$@+%!^-") in USABLE_STATES:
            usable[partition].add(node)
        cpus[node] = int(node_cpus) if node_cpus.isdigit() else 0
        gpus[node] = _gpus(gres)
    tiers = {fields["PartitionName"]: int(fields.get("PriorityTier", "1") or 1)
             for fields in (dict(re.findall(r"(\w+)=(\S*)", line)) for line in partitions.stdout.splitlines())
             if "PartitionName" in fields}
    if not usable:
        return f"the Slurm cluster has no partition: {START_HINT}"
    max_array = config.get("MaxArraySize", "1001")
    return Cluster(
        partitions={name: Partition(name, frozenset(found), name == default, tiers.get(name, 1))
                    for name, found in usable.items()},
        cpus=cpus, gpus=gpus, max_array_size=int(max_array) if max_array.isdigit() else 1001,
        preempt_type=config.get("PreemptType", ""), preempt_mode=config.get("PreemptMode", ""),
        accounting=accounting)


def cluster_problem() -> str | None:
    """None when a cluster with at least one usable node answers, else what is missing."""
    return _problem(Needs())


def _problem(needs: Needs) -> str | None:
    cluster = probe()
    if isinstance(cluster, str):
        return cluster
    missing = needs.unmet(cluster)
    return "needs " + "; ".join(missing) if missing else None


def require(**needs: object) -> Cluster:
    """The cluster, when it has what the test needs; else the test is skipped (failed where the
    project's cluster is required) with the needs it lacks."""
    problem = _problem(Needs(**needs))  # type: ignore[arg-type]
    if problem:
        if os.environ.get(REQUIRED_ENV):
            pytest.fail(f"{REQUIRED_ENV} is set (scripts/test.sh brought the project's cluster up) "
                        f"but this Slurm test cannot run: {problem}")
        pytest.skip(f"Slurm: {problem}")
    cluster = probe()
    assert isinstance(cluster, Cluster)
    return cluster

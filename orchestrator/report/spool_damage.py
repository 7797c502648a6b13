"""The parts of a run that are gone: a deleted directory or shard is said, never read as "nothing".

`status` and `report` read queues, heartbeats, events and shards; a part removed by hand (an `rm`
too many, a scratch purge) read as empty made a run look smaller and healthy (issue 39: with a
shard deleted, `status` showed 8 of 9 jobs finished and no warning). Checked by listing only:
  * the directories `init` makes (SpoolPaths.directories) and shards/.writers;
  * each writer's shards 1..last (its closed name's number, else the highest found): a number
    absent from shards/ and from quarantine/ was deleted, and its rows are lost to readers. A
    writer commits N + 1 only after N, so the one false alarm a listing could give (N renamed
    in while the listing passed) is ruled out by looking the name up before saying it.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shardlog import WriterDirectory, parse_shard_name, shard_exists, shard_name

SHOWN = 5   # deleted shards named one by one, then counted


def missing_parts(paths: SpoolPaths, shard_names: Iterable[str]) -> list[str]:
    """One warning per missing directory, one for the deleted shards (`shard_names`: a listing of shards/)."""
    warnings = [f"{directory.relative_to(paths.root)}/ is missing: what it held is gone for `status`, `report` "
                "and the workers (a run directory is only ever changed by hpc-rollout; restore it from a copy, "
                "or start a new run)"
                for directory in [*paths.directories(), WriterDirectory(paths).root] if not directory.is_dir()]
    deleted = deleted_shards(paths, shard_names)
    if deleted:
        named = ", ".join(deleted[:SHOWN]) + (f" and {len(deleted) - SHOWN} more" if len(deleted) > SHOWN else "")
        warnings.append(f"{len(deleted)} shard(s) deleted from shards/ (not quarantined): {named}; their rows "
                        "are lost, finished counts leave them out")
    return warnings


def deleted_shards(paths: SpoolPaths, shard_names: Iterable[str]) -> list[str]:
    found: dict[str, set[int]] = {}
    for name in shard_names:
        parsed = parse_shard_name(name)
        if parsed is not None:
            found.setdefault(parsed[0], set()).add(parsed[1])
    try:
        last_of = WriterDirectory(paths).closed()
    except OSError:
        last_of = {}
    quarantined = fsops.list_names(paths.quarantine)
    deleted = []
    for writer in sorted(set(found) | set(last_of)):
        seqs = found.get(writer, set())
        for seq in range(1, max(last_of.get(writer, 0), max(seqs, default=0)) + 1):
            name = shard_name(writer, seq)
            if seq not in seqs and not any(q.startswith(f"{name}.") for q in quarantined) \
                    and not shard_exists(paths, writer, seq):
                deleted.append(name)
    return deleted

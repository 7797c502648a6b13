"""`export`: a run's finished groups as an SFT or DPO set, in the layouts TRL and verl read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from orchestrator.cli.console import say, tell, warn
from orchestrator.cli.run_dir import RUN_DIR_TYPE

LAYOUTS = ("trl", "tokens", "verl")
STATUSES = ("ok", "failed", "timeout", "cancelled")


@click.command("export")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--sft", "kind", flag_value="sft", help="A distillation set: the best completion of each group.")
@click.option("--dpo", "kind", flag_value="dpo", help="A preference set: (best, worst) completion of each group.")
@click.option("--layout", type=click.Choice(LAYOUTS), default="trl", show_default=True,
              help="trl: prompt/completion (SFT) or prompt/chosen/rejected (DPO); tokens: input_ids/completion_mask "
                   "(SFT, no text needed); verl: prompt/response/messages (SFT).")
@click.option("--threshold", type=float, help="SFT: keep a completion only if its reward is at least this.")
@click.option("--every", is_flag=True, help="SFT: every ok completion of a group (with --threshold), not only the best.")
@click.option("--tokenizer", metavar="PATH",
              help="Decode response_ids with this tokenizer when the handler kept no response text.")
@click.option("--prompt", "prompts", multiple=True, metavar="ID", help="Only groups of this prompt (instance_id); repeatable.")
@click.option("--group", "groups", multiple=True, metavar="ID", help="Only this group (group_id); repeatable.")
@click.option("--handler", "handlers", multiple=True, help="Only rows of this handler; repeatable.")
@click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES), help="Only groups with a row of this status.")
@click.option("--prompt-contains", metavar="TEXT", help="Only groups whose task contains TEXT.")
@click.option("--reward-min", type=float, help="Only groups with a row rewarded at least this.")
@click.option("--reward-max", type=float, help="Only groups with a row rewarded at most this.")
@click.option("--version-min", type=int, help="Only groups with a row sampled entirely at policy version >= this.")
@click.option("--version-max", type=int, help="Only groups with a row sampled entirely at policy version <= this.")
@click.option("--turns-min", type=int, help="Only groups with a row of at least this many model turns.")
@click.option("--turns-max", type=int, help="Only groups with a row of at most this many model turns.")
def export_cmd(run_dir: str, out: Path, kind: Any, layout: Any, threshold: float | None, every: bool,
               tokenizer: str | None, **filters: Any) -> None:
    """Write a run's groups as a distillation (--sft) or preference (--dpo) set.

    \b
    Examples:
      hpc-rollout export spool/run1 --sft best.jsonl                     # best completion per group
      hpc-rollout export spool/run1 --sft good.parquet --threshold 1 --every --version-min 3
      hpc-rollout export spool/run1 --sft sft.parquet --layout verl      # verl's SFT trainers
      hpc-rollout export spool/run1 --dpo pairs.parquet --handler chat   # TRL's DPOTrainer

    OUT's suffix chooses the format: .parquet or .jsonl. Both load with
    datasets.load_dataset("parquet" | "json", data_files=OUT).

    \b
    SFT: per group the ok sample with the highest reward (--every: each ok sample) whose reward
         reaches --threshold. Layouts: trl (prompt, completion: TRL SFTTrainer), tokens
         (input_ids, completion_mask: the exact tokens sampled, tool output masked), verl
         (prompt, response for SFTDataset; messages for data.multiturn.enable=true).
    DPO: per group chosen = the highest-, rejected = the lowest-rewarded ok sample; a group
         whose ok samples all have one reward gives no pair (counted in the summary).

    The filters choose groups: a group is exported when one of its rows matches them all
    (the same query as Spool.query in Python). Text comes from the task (messages, prompt or
    question) and the handler's response_text, else --tokenizer decodes response_ids. A shard
    that cannot be read is named and skipped.
    """
    from orchestrator.cli.core import _open
    from orchestrator.errors import HpcRolloutError
    from orchestrator.trainer.export import EXPORT_COLUMNS, LAYOUT_COLUMNS, export_records, write_records
    from orchestrator.trainer.replay import query_groups
    from orchestrator.trainer.replay_filter import Query

    if kind is None:
        raise click.UsageError("choose what to export: --sft or --dpo")
    paths, _ = _open(run_dir)
    if (kind, layout) not in LAYOUT_COLUMNS:
        raise click.UsageError(f"--layout {layout} is for SFT only; DPO is written in the trl layout")
    try:
        query = Query(**filters)
        tell(f"reading the shards of {run_dir} ...")
        replay = query_groups(paths, query, EXPORT_COLUMNS)
        decode = _decoder(tokenizer) if tokenizer else None
        exported = export_records(replay.groups, kind, layout, threshold=threshold, every=every, decode=decode)
        write_records(exported.records, LAYOUT_COLUMNS[kind, layout], out)
    except HpcRolloutError as exc:
        raise click.ClickException(str(exc)) from None
    for problem in replay.skipped:
        warn(problem)
    what = "pair(s)" if kind == "dpo" else "sample(s)"
    say(f"export {kind} ({layout}): {replay.rows_scanned} row(s) read from {replay.shards_read} shard(s), "
        f"{len(replay.groups)} group(s) selected, {len(exported.records)} {what} written to {out}")
    for why, count in exported.skipped.most_common():
        say(f"  skipped {count}: {why}")
    if replay.skipped:
        say(f"  {len(replay.skipped)} shard(s) could not be read (named above)")


def _decoder(path: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def register(cli: click.Group) -> None:
    cli.add_command(export_cmd)

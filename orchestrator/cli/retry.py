"""`retry`: queue a run's failed, timed-out or cancelled jobs again, their earlier attempts kept."""

from __future__ import annotations

import click

from orchestrator.cli.console import Tone, say, styled
from orchestrator.cli.run_dir import RUN_DIR_TYPE


@click.command("retry")
@click.argument("run_dir", type=RUN_DIR_TYPE)
@click.argument("job_ids", nargs=-1)
@click.option("--failed", is_flag=True, help="Every job whose row says failed or timeout.")
@click.option("--cancelled", is_flag=True, help="Every job whose row says cancelled.")
@click.option("--whole-groups", is_flag=True,
              help="Retry every sample of the groups concerned, as full groups (default: only the jobs chosen).")
def retry_cmd(run_dir: str, job_ids: tuple[str, ...], failed: bool, cancelled: bool, whole_groups: bool) -> None:
    """Queue finished jobs again: the failed or cancelled ones, or those named.

    \b
    Examples:
      hpc-rollout retry spool/run1 --failed                 # failed and timed-out jobs
      hpc-rollout retry spool/run1 --failed --cancelled
      hpc-rollout retry spool/run1 20260101T120000000-ab12-0000003-0001
      hpc-rollout retry spool/run1 --failed --whole-groups  # GRPO: resample whole groups

    Each job is rebuilt from its row and queued as a new submission with fresh ids: the earlier
    row stays in its shard, a trainer reading the shards gets each job once, and
    submissions/ID.json maps every new job to the one it retries. `hpc-rollout inspect RUN JOB`
    shows every attempt of a job. A job already retried is skipped by --failed/--cancelled
    (its retry is the one to look at); naming it retries it again.

    The retried samples of one group come back as a group of their own (the trainer already got
    the first group, with the failed samples masked); --whole-groups samples such groups whole
    again. Running workers take the jobs; otherwise start some (`hpc-rollout launch`).
    """
    from orchestrator.cli.core import _batch_size, _next_step, _open
    from orchestrator.submission.retry import RetryChoice, RetryError, retry_jobs

    statuses = ({"failed", "timeout"} if failed else set()) | ({"cancelled"} if cancelled else set())
    if not (statuses or job_ids):
        raise click.UsageError("choose what to retry: --failed, --cancelled or job ids")
    paths, _ = _open(run_dir)
    choice = RetryChoice(frozenset(statuses), tuple(job_ids), whole_groups)
    try:
        report = retry_jobs(paths, choice, _batch_size(paths))
    except RetryError as exc:
        raise click.ClickException(str(exc)) from None
    for problem in report.skipped_shards:
        say(styled("warning:", Tone.WARNING), f" {problem}")
    new = list(report.retries)
    say(f"retry {report.submission_id}: {len(new)} job(s) in {report.groups} group(s) queued again")
    say(f"  jobs {new[0]} .. {new[-1]} (submissions/{report.submission_id}.json maps each to the job it retries)")
    if report.already:
        say(f"  {len(report.already)} job(s) skipped: retried before (their retries are the ones to look at)")
    say(_next_step(paths, run_dir))


def register(cli: click.Group) -> None:
    cli.add_command(retry_cmd)

"""Slurm integration: job arrays of node workers through submitit, sbatch templates, queries.

One concept per module:
    errors.py     the small exception hierarchy
    timespec.py   Slurm time limits ("04:00:00", "2-00:00") <-> minutes
    cluster.py    is Slurm here? site limits read from `scontrol show config`
    queries.py    squeue/sacct states, warnings for `status`; degrade when absent
    templates.py  Jinja2 sbatch templates in the `sbatch` package, quoted and validated
    options.py    LaunchOptions: what `launch --nodes` asks Slurm for
    node_job.py   NodeWorker: what each array task runs (launch's and the template's), its signals
    node_task.py  `python -m orchestrator.slurm.node_task`: the template's command for it
    launcher.py   submit (or dry-run) the array(s) through submitit
    submitit_task.py  how launch's tasks enter Python: a warning while they start is kept
"""

from orchestrator.slurm.errors import (
    LaunchError,
    SlurmError,
    SlurmUnavailable,
    TemplateError,
    UnknownSetting,
    UnknownTemplate,
)

__all__ = [
    "LaunchError",
    "SlurmError",
    "SlurmUnavailable",
    "TemplateError",
    "UnknownSetting",
    "UnknownTemplate",
]

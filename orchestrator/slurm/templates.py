"""Render the Jinja2 sbatch templates shipped in the `sbatch` package.

Safety by construction: every `{{ value }}` is shell-quoted on output (Environment.finalize),
so no setting can inject shell, and every setting is validated by its kind before rendering
(no newline reaches an `#SBATCH` line). Only the kinds COMMAND and COMMANDS are emitted raw:
they are shell by intent (`--set python="apptainer exec img.sif python"`, `--set setup=...`).
"""

from __future__ import annotations

import enum
import importlib.resources
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

# jinja2 loads only to render: the template names and settings feed `hpc-rollout --help`.
if TYPE_CHECKING:
    import jinja2

from orchestrator.slurm.errors import TemplateError, UnknownSetting, UnknownTemplate
from orchestrator.slurm.options import DEFAULT_SIGNAL, DEFAULT_SIGNAL_DELAY_S, DEFAULT_TIME, LaunchOptions
from orchestrator.slurm.timespec import FORMATS, format_minutes, parse_minutes
from orchestrator.settings_spec import declarations
from orchestrator.worker.options import WorkerOptions

SUFFIX = ".sbatch.j2"


class ValueKind(enum.Enum):
    INT = "int"              # positive integer (0 allowed where the default is 0: "off")
    BOOL = "bool"            # true/false/1/0/yes/no
    TIME = "time"            # Slurm time limit, normalised to D-HH:MM:SS
    WORD = "word"            # partition, account, memory, signal names: no spaces
    TEXT = "text"            # free single-line text, quoted on output
    ARGS = "args"            # shell-split into words, each quoted on output
    COMMAND = "command"      # one line of shell, emitted raw (by intent)
    COMMANDS = "commands"    # lines of shell, emitted raw (by intent); repeat --set to add
    WORKER = "worker"        # a worker option, checked by its declaration (orchestrator/worker/options.py)


class Raw(str):
    """A string the template may emit without quoting: only COMMAND/COMMANDS values become Raw."""


@dataclass(frozen=True)
class Setting:
    name: str
    kind: ValueKind
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    required: bool = False
    check: Callable[[str], Any] | None = None   # ValueKind.WORKER: the declaration's own check


_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.,:=+@/%-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _common(job_name: str) -> tuple[Setting, ...]:
    return (
        Setting("run_dir", ValueKind.TEXT, "spool/run1", "run directory (the spool) on the shared filesystem"),
        Setting("job_name", ValueKind.WORD, job_name, "Slurm job name (%x in log names)"),
        Setting("partition", ValueKind.WORD, None, "partition; omitted: the site default"),
        Setting("account", ValueKind.WORD, None, "account to charge"),
        Setting("qos", ValueKind.WORD, None, "quality of service"),
        Setting("time", ValueKind.TIME, DEFAULT_TIME, f"time limit ({FORMATS})"),
        Setting("mem", ValueKind.WORD, None, "memory per node, e.g. 64G; omitted: the site default"),
        Setting("signal", ValueKind.WORD, DEFAULT_SIGNAL, "warning signal before preemption/time limit", ("USR1", "USR2", "TERM", "INT", "HUP")),
        Setting("signal_delay_s", ValueKind.INT, DEFAULT_SIGNAL_DELAY_S, "seconds between the warning signal and the end"),
        Setting("python", ValueKind.COMMAND, "python3", "command that runs Python (e.g. inside a container)"),
        Setting("setup", ValueKind.COMMANDS, (), "shell lines run before the main command (repeatable)"),
        Setting("log_dir", ValueKind.TEXT, None, "folder for the logs; default RUN_DIR/logs (must exist)"),
    )


def _worker_settings(job_name: str, stages: str, exclusive: bool) -> tuple[Setting, ...]:
    return _common(job_name) + (
        Setting("nodes", ValueKind.INT, 1, "array tasks, one node worker each"),
        Setting("array_parallelism", ValueKind.INT, 0, "at most this many tasks at once (0: no limit)"),
        Setting("cpus_per_node", ValueKind.INT, 0, "CPUs per task (0: the site default)"),
        Setting("gpus_per_node", ValueKind.INT, 0, "GPUs per task (0: none)"),
        Setting("exclusive", ValueKind.BOOL, exclusive, "whole nodes: one worker per node"),
    ) + tuple(
        # Every worker option a user sets, from its declaration: unset ones stay off the command line
        # (the worker takes run.toml's), a number is the number (0 slots is 0 slots).
        Setting(name, ValueKind.WORKER, stages if name == "stages" else None, spec.full_help, spec.choices, check=spec.check)
        for name, spec in declarations(WorkerOptions).items() if not spec.by_launcher)


SETTINGS: dict[str, tuple[Setting, ...]] = {
    # The node-worker template and `launch --nodes` (LaunchOptions) share their defaults.
    "worker": _worker_settings("hpc-rollout-worker", "init,run,eval", LaunchOptions.exclusive),
    "eval": _worker_settings("hpc-rollout-eval", "eval", False),
    "vllm": _common("hpc-rollout-vllm") + (
        Setting("model", ValueKind.TEXT, None, "model path or hub name to serve", required=True),
        Setting("protocol", ValueKind.WORD, "vllm", "server to start", ("vllm", "sglang")),
        Setting("gpus", ValueKind.INT, 1, "GPUs on the node (tensor parallel size)"),
        Setting("cpus", ValueKind.INT, 0, "CPUs for the server (0: the site default)"),
        Setting("port", ValueKind.INT, 8000, "HTTP port of the server"),
        Setting("served_model_name", ValueKind.TEXT, None, "name clients ask for; default: the model"),
        Setting("extra_args", ValueKind.ARGS, (), "more server arguments, shell-split and quoted"),
        Setting("health_timeout_s", ValueKind.INT, 1800, "give up if no token is completed by then (seconds)"),
        Setting("hpc_rollout", ValueKind.COMMAND, "hpc-rollout", "command that runs the hpc-rollout CLI"),
    ),
}


def template_names() -> list[str]:
    return sorted(SETTINGS)


def settings_of(name: str) -> tuple[Setting, ...]:
    if name not in SETTINGS:
        raise UnknownTemplate(name, template_names())
    return SETTINGS[name]


def _finalize(value: Any) -> Any:
    # Runs on every {{ expression }}: quote unless the value is shell by intent.
    if isinstance(value, Raw) or isinstance(value, (bool, int)):
        return value
    if value is None:
        raise TemplateError("a template printed an unset value; guard it with {% if %}")
    return shlex.quote(str(value))


def environment() -> jinja2.Environment:
    import jinja2

    loader = jinja2.FunctionLoader(_load_source)
    return jinja2.Environment(
        loader=loader,
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def _load_source(name: str) -> str:
    import jinja2

    resource = importlib.resources.files("hpc_rollout.sbatch").joinpath(name)
    if not resource.is_file():
        raise jinja2.TemplateNotFound(name)
    return resource.read_text(encoding="utf-8")


def _convert(template: str, setting: Setting, raw: Any) -> Any:
    where = f"{template}: setting {setting.name}"
    if setting.kind is ValueKind.WORKER and setting.check is not None and not isinstance(raw, (list, tuple)):
        try:
            return setting.check(str(raw))
        except ValueError as exc:
            raise TemplateError(f"{where}: {exc}") from None
    if setting.kind is ValueKind.COMMANDS:
        items = [raw] if isinstance(raw, str) else list(raw)
        for item in items:
            if _CONTROL.search(item):
                raise TemplateError(f"{where}: each command must be one line")
        return tuple(Raw(item) for item in items)
    if setting.kind is ValueKind.ARGS:
        words = shlex.split(raw) if isinstance(raw, str) else [str(w) for w in raw]
        if any(_CONTROL.search(w) for w in words):
            raise TemplateError(f"{where}: arguments must not contain control characters")
        return tuple(words)
    if isinstance(raw, (list, tuple)):
        raise TemplateError(f"{where} takes one value, got {len(raw)}")
    text = str(raw)
    if _CONTROL.search(text):
        raise TemplateError(f"{where}: newlines and control characters are not allowed")
    if setting.kind is ValueKind.INT:
        if isinstance(raw, bool) or not re.fullmatch(r"\d+", text.strip()):
            raise TemplateError(f"{where} must be a whole number >= 0, got {text!r}")
        return int(text)
    if setting.kind is ValueKind.BOOL:
        if isinstance(raw, bool):
            return raw
        low = text.strip().lower()
        if low not in _TRUE | _FALSE:
            raise TemplateError(f"{where} must be one of true, false, 1, 0, yes, no; got {text!r}")
        return low in _TRUE
    if setting.kind is ValueKind.TIME:
        try:
            return format_minutes(parse_minutes(text))
        except ValueError as exc:
            raise TemplateError(f"{where}: {exc}") from exc
    if setting.choices and text not in setting.choices:
        raise TemplateError(f"{where} must be one of {', '.join(setting.choices)}; got {text!r}")
    if setting.kind is ValueKind.WORD and not _WORD.match(text):
        raise TemplateError(f"{where} must be one word of letters, digits and _.,:=+@/%-; got {text!r}")
    if setting.kind is ValueKind.COMMAND:
        return Raw(text)
    return text


def resolve(name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with validated values; unknown keys raise UnknownSetting listing valid ones."""
    settings = settings_of(name)
    by_name = {s.name: s for s in settings}
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise UnknownSetting(name, unknown, sorted(by_name))
    context: dict[str, Any] = {}
    for setting in settings:
        if setting.name in values and values[setting.name] is not None:
            context[setting.name] = _convert(name, setting, values[setting.name])
        elif setting.required:
            raise TemplateError(f"template {name!r} needs --set {setting.name}=... ({setting.help})")
        elif setting.default is None:
            context[setting.name] = None
        else:
            context[setting.name] = _convert(name, setting, setting.default)
    if context.get("log_dir") is None:
        context["log_dir"] = context["run_dir"].rstrip("/") + "/logs"
    worker = {s.name: context[s.name] for s in settings if s.kind is ValueKind.WORKER and context[s.name] is not None}
    if worker:   # the node task's worker arguments, as `launch` would pass them
        context["worker_args"] = WorkerOptions(**worker).to_args()
    return context


def render(name: str, values: Mapping[str, Any] | None = None) -> str:
    """The batch script text of template `name` with `values` (strings, ints or lists)."""
    import jinja2

    context = resolve(name, values or {})
    try:
        return environment().get_template(name + SUFFIX).render(context)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template {name!r}: {exc}") from exc


def parse_assignments(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`--set k=v` pairs as a dict; a key given twice becomes a list (setup lines, ...)."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise TemplateError(f"--set takes KEY=VALUE, got {pair!r}")
        if key in values:
            previous = values[key]
            values[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            values[key] = value
    return values

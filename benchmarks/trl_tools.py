"""TRL's GRPOTrainer on two-turn tool episodes: TRL's own tool loop against the spool's workers.

Both sides train the same tiny tool-calling model (benchmarks/tool_model.py: asked "say 7" under
the `math` handler's system prompt and tools, it calls the python tool with code that sleeps the
tool latency, then replies \\boxed{7}) on the same prompts with the same GRPOConfig:
  in-process  GRPOTrainer(tools=[python, think, submit]): TRL generates the batch, parses the calls
              (the tiny chat template's RESPONSE_TEMPLATE), runs each sample's tool calls in the
              trainer's process one sample after another, then generates the next turn
  spool       rollout_func=SpoolRollout submitting `math` jobs: each job's agent loop in a local
              worker, its python tool in the job's sandbox, serve-llm over HTTP; the weights pushed
              each step (SwapWeightsCallback), as in benchmarks/trl.py
The tools TRL renders are our ToolSpecs (the same JSON in the prompt, checked), the in-process
python tool executes the code as ours does (a persistent namespace, "[no output]" when silent).
The learning rate is 1e-6: the update costs what it costs at any rate, and the taught episode
stays what both sides sample (at 1e-3 the format drifts within the run). Temperature 0.5: the
taught call is well-formed in 64 of 64 samples there (48 of 64 at 1.0).
"""

from __future__ import annotations

import contextlib
import inspect
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import median
from benchmarks.tool_model import TOOLS, prompt_messages, tool_model_dir
from benchmarks.trl import GENERATIONS, served_spool, timed

TEMPERATURE = 0.5
COMPLETION_TOKENS = 192      # the whole episode after the prompt: the call, the tool's answer, the reply
LEARNING_RATE = 1e-6
PYTHON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}


def digit_rows() -> list[dict[str, Any]]:
    return [{"prompt": prompt_messages(d), "digit": str(d)} for d in range(10)]


def math_task(prompt: list[dict[str, str]]) -> dict[str, Any]:
    problem = prompt[-1]["content"]
    return {"handler": "math", "instance": {"problem": problem, "answer": problem[-1]}}


def boxed_digit(completions: list[Any], digit: list[str], **_: Any) -> list[float]:
    """1 when the episode's last message holds \\boxed{digit} (the math handler's reward, for these rows)."""
    finals = [c[-1].get("content") or "" if isinstance(c, list) else c for c in completions]
    return [1.0 if f"\\boxed{{{d}}}" in text else 0.0 for text, d in zip(finals, digit)]


class ToolCounter:
    """The in-process tools: our ToolSpecs as the typed, documented functions TRL renders, counting
    python calls (the check that TRL's loop ran the tool)."""

    def __init__(self) -> None:
        self.python_calls = 0
        self.namespace: dict[str, Any] = {}

    def functions(self) -> list[Callable[..., str]]:
        from orchestrator.agent.tools import tool_specs

        doing = {"python": self.python, "think": lambda **_: "Your thought has been noted.",
                 "submit": lambda **_: "Answer submitted."}
        return [documented(spec.name, spec.description, spec.parameters, doing[spec.name])
                for spec in tool_specs(TOOLS)]

    def python(self, code: str) -> str:
        self.python_calls += 1
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, self.namespace)   # the benchmark's own taught code: a sleep
        return out.getvalue().rstrip("\n") or "[no output]"


def documented(name: str, description: str, parameters: dict[str, Any], run: Callable[..., str]) -> Callable[..., str]:
    """A function transformers' get_json_schema turns back into exactly this tool's schema."""
    properties = parameters["properties"]
    required = set(parameters.get("required", []))

    def tool(**arguments: Any) -> str:
        return run(**arguments)

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = description + "\n\nArgs:\n" + "".join(f"    {key}: {spec['description']}\n"
                                                           for key, spec in properties.items())
    signature = [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=PYTHON_TYPES[spec["type"]],
                                   **({} if key in required else {"default": None}))
                 for key, spec in properties.items()]
    tool.__signature__ = inspect.Signature(signature)   # type: ignore[attr-defined]
    tool.__annotations__ = {key: PYTHON_TYPES[spec["type"]] for key, spec in properties.items()}
    return tool


def config(out: Path, steps: int) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(out), use_cpu=True, max_steps=steps, learning_rate=LEARNING_RATE,
                      per_device_train_batch_size=2 * GENERATIONS, num_generations=GENERATIONS,
                      max_completion_length=COMPLETION_TOKENS, temperature=TEMPERATURE, logging_steps=1,
                      report_to=[], save_strategy="no", bf16=False, seed=0, max_tool_calling_iterations=2)


def tokenizer_of(model: Path) -> Any:
    from transformers import AutoTokenizer

    from orchestrator.devserver.tiny_model import RESPONSE_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def check_same_prompt(tokenizer: Any, tools: list[Callable[..., str]]) -> None:
    from orchestrator.agent.tools import openai_tools, tool_specs

    ours = tokenizer.apply_chat_template(prompt_messages(7), tools=openai_tools(tool_specs(TOOLS)), tokenize=False)
    theirs = tokenizer.apply_chat_template(prompt_messages(7), tools=tools, tokenize=False)
    if ours != theirs:
        raise RuntimeError("TRL renders the tools unlike the math handler: the two sides' prompts differ")


def run_in_process(model: Path, out: Path, steps: int) -> tuple[list[float], float]:
    """Step seconds, and python calls per sample."""
    from datasets import Dataset
    from trl import GRPOTrainer

    clock, tools = timed(), ToolCounter()
    tokenizer, functions = tokenizer_of(model), tools.functions()
    check_same_prompt(tokenizer, functions)
    trainer = GRPOTrainer(model=str(model), processing_class=tokenizer, reward_funcs=[boxed_digit],
                          args=config(out, steps), train_dataset=Dataset.from_list(digit_rows()),
                          tools=functions, callbacks=[clock])
    trainer.train()
    return list(clock.seconds), tools.python_calls / (steps * 2 * GENERATIONS)


def run_spool(model: Path, out: Path, steps: int) -> tuple[list[float], float]:
    """Step seconds, and python calls per sample (from the rows)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from orchestrator.trainer.trl import SpoolRollout, SwapWeightsCallback, spool_reward

    with served_spool(out, model) as spool:
        rollout = SpoolRollout(spool, task_of=math_task, time_limit_s=300)
        clock = timed()
        trainer = GRPOTrainer(model=str(model), processing_class=tokenizer_of(model), reward_funcs=[spool_reward],
                              args=config(out, steps), train_dataset=Dataset.from_list(digit_rows()),
                              rollout_func=rollout, callbacks=[clock, SwapWeightsCallback(spool, out / "ckpt")])
        trainer.train()
    return list(clock.seconds), python_calls(spool) / (steps * 2 * GENERATIONS)


def python_calls(spool: Any) -> int:
    import pyarrow.parquet as pq

    calls = 0
    for shard in sorted(spool.paths.shards.glob("*.parquet")):
        for row in pq.read_table(shard, columns=["tool_calls"]).column("tool_calls").to_pylist():
            calls += sum(1 for call in row or [] if call.get("name") == "python")
    return calls


def compare(work: Path, seconds: float, steps: int, teach_steps: int) -> tuple[list[Any], dict[str, float]]:
    """One tool latency, both sides one after the other: the table row and the figures."""
    model = tool_model_dir(seconds, teach_steps)
    in_process, calls_in_process = run_in_process(model, work / f"tools-in-process-{seconds:g}", steps)
    spool, calls_spool = run_spool(model, work / f"tools-spool-{seconds:g}", steps)
    spool_s, in_process_s = median(spool[1:] or spool), median(in_process[1:] or in_process)   # the first warms up
    row = [f"{seconds:g}", in_process_s, spool_s, f"{spool_s / in_process_s:.2f}",
           f"{calls_in_process:.2f} / {calls_spool:.2f}"]
    return row, {"step_s_spool": round(spool_s, 4), "step_s_in_process": round(in_process_s, 4),
                 "spool_over_in_process": round(spool_s / in_process_s, 3),
                 "python_calls_per_sample_spool": calls_spool, "python_calls_per_sample_in_process": calls_in_process}

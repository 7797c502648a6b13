"""A tiny model that calls a tool: the tiny character-level model taught one two-turn episode.

Asked "say 7" under the `math` handler's system prompt and tools, it calls the python tool with
code that sleeps a given time (a tool's latency, as a sandbox command has) and, once the tool
answered, replies \\boxed{7}. A random model never writes a well-formed tool call, and TRL's tool
loop runs a tool only when the chat template's parser finds one, so without this the in-process
side of benchmarks/trl_tools.py would have no tool to time. Built once per step count by
supervised steps (orchestrator/devserver/supervised.py) for each latency, cached next to the tiny
model. Measured at 200 steps: 64 of 64 samples at temperature 0.5 call the tool exactly so; 48 of
64 at 1.0.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from hpc_rollout.handlers.math_task import SYSTEM, MathHandler
from orchestrator.agent.tools import openai_tools, tool_specs
from orchestrator.devserver.supervised import Example, labelled, teach
from orchestrator.devserver.tiny_model import cached_model, tiny_digits_model_dir

TOOLS = MathHandler.tools
NO_OUTPUT = "[no output]"   # what the python tool returns for code that prints nothing (agent/toolbox.py)
RECIPE = "tiny-ascii-python-tool-v1"
LEARNING_RATE = 5e-3
EXAMPLES_PER_STEP = 16


def prompt_messages(digit: int) -> list[dict[str, str]]:
    """The conversation the `math` handler renders for the problem "say DIGIT"."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"say {digit}"}]


def code(seconds: float) -> str:
    return f"import time; time.sleep({seconds:g})"


def tool_call(seconds: float) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": code(seconds)}}}]}


def episode(tokenizer: Any, digit: int, seconds: float) -> Example:
    """The prompt, the tool call (learnt), the tool's answer and the reply (learnt), as rendered
    by the chat template with the handler's tools."""
    tools = openai_tools(tool_specs(TOOLS))
    messages = prompt_messages(digit)
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    called = tokenizer.apply_chat_template([*messages, tool_call(seconds)], tools=tools, tokenize=False).rstrip("\n")
    answered = tokenizer.apply_chat_template([*messages, tool_call(seconds), {"role": "tool", "name": "python",
                                             "content": NO_OUTPUT}], tools=tools, add_generation_prompt=True,
                                             tokenize=False)
    if not (called.startswith(prompt) and answered.startswith(called)):
        raise RuntimeError("the chat template does not render the episode as a prefix of its next turn")
    reply = f"\\boxed{{{digit}}}{tokenizer.eos_token}"
    return labelled(tokenizer, [(prompt, False), (called[len(prompt):], True), (answered[len(called):], False),
                                (reply, True)])


def tool_model_dir(seconds: float, steps: int = 200) -> Path:
    """The cached model whose tool call sleeps `seconds`, taught for `steps` supervised steps (built
    on first use, ~0.5 s a step on 2 cores)."""
    return cached_model(f"{RECIPE}-{seconds:g}s-{steps}", lambda directory: build(directory, seconds, steps))


def build(directory: Path, seconds: float, steps: int) -> None:
    from transformers import AutoTokenizer

    base = tiny_digits_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    examples = {digit: episode(tokenizer, digit, seconds) for digit in range(10)}

    def batch(draw: random.Random) -> list[Example]:
        return [examples[draw.randrange(10)] for _ in range(EXAMPLES_PER_STEP)]

    teach(base, directory, batch, steps, LEARNING_RATE, seed=0)

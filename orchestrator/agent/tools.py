"""Tool declarations as OpenAI function schemas (what the chat template renders with `tools=`).

`openai_tools(specs)` is the list handed to `tokenizer.apply_chat_template(..., tools=...)`;
`check_arguments(spec, arguments)` returns the problems of one call's arguments, worded for
the model, so a call with a missing or mistyped argument becomes an error observation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,),
}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]          # a JSON schema of type "object"
    ends_episode: bool = False          # submit / finish end the loop

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


BASH = ToolSpec(
    "bash",
    "Run a command in a persistent bash shell in the sandbox (cd and variables persist; stdin is "
    "empty). Returns the output and the exit code. Long outputs are cut in the middle.",
    _object({"command": {"type": "string", "description": "The bash command to run."}}, ["command"]),
)
PYTHON = ToolSpec(
    "python",
    "Run Python code in a persistent interpreter (variables and imports persist between calls). "
    "Returns stdout, stderr and the value of the last expression.",
    _object({"code": {"type": "string", "description": "Python source to execute."}}, ["code"]),
)
EDITOR_COMMANDS = ["view", "create", "str_replace", "insert", "undo_edit"]
STR_REPLACE_EDITOR = ToolSpec(
    "str_replace_editor",
    "View, create and edit files. view: show a file with line numbers (or list a directory); "
    "create: write file_text to path; str_replace: replace old_str (exact, unique) with new_str; "
    "insert: insert new_str after line insert_line (0 = at the top); undo_edit: revert the last "
    "edit of path. Paths are relative to the working directory or absolute.",
    _object({
        "command": {"type": "string", "enum": EDITOR_COMMANDS, "description": "The edit to make."},
        "path": {"type": "string", "description": "File or directory."},
        "file_text": {"type": "string", "description": "create: the whole content."},
        "old_str": {"type": "string", "description": "str_replace: the exact text to replace."},
        "new_str": {"type": "string", "description": "str_replace / insert: the new text."},
        "insert_line": {"type": "integer", "description": "insert: the line after which to insert."},
        "view_range": {"type": "array", "items": {"type": "integer"},
                       "description": "view: [first, last] line, last -1 = end of file."},
    }, ["command", "path"]),
)
THINK = ToolSpec(
    "think",
    "Write down your reasoning; nothing is executed and nothing changes.",
    _object({"thought": {"type": "string", "description": "Your thoughts."}}, ["thought"]),
)
SUBMIT = ToolSpec(
    "submit",
    "Submit your final answer and end the task.",
    _object({"answer": {"type": "string", "description": "The final answer, e.g. 42 or \\frac{3}{4}."}}, ["answer"]),
    ends_episode=True,
)
FINISH = ToolSpec(
    "finish",
    "Say that the task is done (your files and changes in the sandbox are what counts) and end it.",
    _object({"message": {"type": "string", "description": "Optional summary of what you did."}}, []),
    ends_episode=True,
)
SUMMARIZE = ToolSpec(
    "summarize",
    "Free context: your earlier turns (all but the last few) are replaced by the summary you write "
    "here. Say what you found, what you changed and what is left to do; nothing else is kept of them.",
    _object({"summary": {"type": "string", "description": "What the earlier turns did and found."}}, ["summary"]),
)
STANDARD_TOOLS: dict[str, ToolSpec] = {t.name: t for t in (BASH, PYTHON, STR_REPLACE_EDITOR, THINK, SUBMIT, FINISH,
                                                           SUMMARIZE)}


def tool_specs(names: list[str] | tuple[str, ...]) -> tuple[ToolSpec, ...]:
    """Standard tools by name, or ValueError listing them."""
    unknown = [n for n in names if n not in STANDARD_TOOLS]
    if unknown:
        raise ValueError(f"unknown tool(s) {unknown}; standard tools: {', '.join(STANDARD_TOOLS)}")
    return tuple(STANDARD_TOOLS[n] for n in names)


def openai_tools(specs: tuple[ToolSpec, ...] | list[ToolSpec]) -> list[dict[str, Any]]:
    return [spec.openai() for spec in specs]


def check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> list[str]:
    """Problems with `arguments` against the spec's schema: required, types, enums, unknown keys."""
    properties: dict[str, Any] = spec.parameters.get("properties", {})
    problems = [f"missing required argument {name!r}" for name in spec.parameters.get("required", [])
                if name not in arguments]
    for name, value in arguments.items():
        schema = properties.get(name)
        if schema is None:
            problems.append(f"unknown argument {name!r} (valid: {', '.join(properties) or 'none'})")
            continue
        expected = JSON_TYPES.get(schema.get("type", ""), ())
        if expected and (not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)):
            problems.append(f"argument {name!r} must be of type {schema['type']}, got {type(value).__name__}")
        elif "enum" in schema and value not in schema["enum"]:
            problems.append(f"argument {name!r} must be one of {', '.join(map(str, schema['enum']))}, got {value!r}")
    return problems

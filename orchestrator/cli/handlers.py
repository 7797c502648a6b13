"""`hpc-rollout handlers [NAME]`: the installed handlers, and the instance fields of one."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.table import Table

from orchestrator.cli.console import Tone, out, say, styled
from orchestrator.handler_api.contract import ENTRY_POINT_GROUP, AgentHandler, HandlerError, available_handlers, load_handler
from orchestrator.handler_api.reward_rule import RewardRule, rules_markdown
from orchestrator.handler_api.schema import InstanceSchema, Kind

# The task families whose reward rules docs/agents.md shows (`--markdown`), in its order.
DOCUMENTED = ("math", "code", "swe", "answer", "chat", "harness", "reasoning_gym", "verifiers")

PLACEHOLDERS: dict[Kind, Any] = {Kind.STRING: "...", Kind.NUMBER: 1.0, Kind.INTEGER: 1, Kind.BOOLEAN: True,
                                 Kind.OBJECT: {}, Kind.LIST: [], Kind.NULL: None, Kind.ANY: "..."}


def _summary(handler: AgentHandler) -> str:
    """The first paragraph of the handler class's docstring, else of its module's."""
    cls = type(handler)
    module = sys.modules.get(cls.__module__)
    doc = cls.__doc__ or (module.__doc__ if module is not None else None) or ""
    first = " ".join(doc.strip().split("\n\n", 1)[0].split())
    return first.split(": ", 1)[1] if first.startswith("`") and ": " in first else first


def example_row(name: str, schema: InstanceSchema | None) -> str:
    """A row with the required keys filled by placeholders of their type."""
    instance = {k.name: PLACEHOLDERS[k.kinds[0]] for k in (schema.keys if schema else ()) if k.required}
    return json.dumps({"handler": name, "instance": instance})


def documented_rules() -> dict[str, RewardRule]:
    """The reward rules of the DOCUMENTED families, as their handlers declare them."""
    rules = {}
    for family in DOCUMENTED:
        rule = load_handler(family).reward_rule
        if rule is not None:
            rules[family] = rule
    return rules


def _print_rule(rule: RewardRule | None) -> None:
    if rule is None:
        say("reward rule: not declared (the handler's class sets none: read its documentation)")
        return
    table = Table(title=f"reward rule: {rule.summary}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for title, text in rule.lines():
        table.add_row(title, text)
    out.print(table)


@click.command("handlers")
@click.argument("name", required=False)
@click.option("--markdown", is_flag=True, help="Print the reward rules of the bundled task families as the "
              "Markdown table of docs/agents.md.")
def handlers_cmd(name: str | None, markdown: bool = False) -> None:
    """The installed handlers (task families), or the reward rule and instance fields of handler NAME.

    \b
    Examples:
      hpc-rollout handlers             # every handler, one line each
      hpc-rollout handlers math        # its reward rule, then its instance keys: type, default, meaning
      hpc-rollout handlers --markdown  # the reward rules of math, code, swe, answer, chat, harness
    `submit` checks each row's instance against its handler's schema: an unknown key is
    refused with the key it probably meant. Handlers come from the entry point group
    hpc_rollout.handlers, so a package of yours can add one.
    """
    if markdown:
        click.echo(rules_markdown(documented_rules()))
        return
    if name is None:
        _list_all()
        return
    try:
        handler = load_handler(name)
    except HandlerError as exc:
        raise click.ClickException(str(exc)) from None
    schema = handler.instance_schema
    say(styled(name, Tone.STRONG), f": {_summary(handler)}")
    _print_rule(handler.reward_rule)
    if schema is None:
        say("no instance schema: its rows are not checked at submit beyond the handler's own validate_instance")
        return
    table = Table(title="instance keys", title_justify="left")
    for column in ("key", "type", "required / default", "meaning"):
        table.add_column(column)
    for row in schema.rows():
        table.add_row(*row)
    out.print(table)
    notes = []
    if schema.open:
        notes.append("other keys are accepted as they are")
    if schema.accepts_verl_rows:
        notes.append("verl rows (data_source, prompt, ability, reward_model, extra_info) are accepted as they are")
    for note in notes:
        say(f"  {note}")
    say(f"  example row: {example_row(name, schema)}")
    say(f"  hpc-rollout submit RUN_DIR tasks.jsonl --handler {name} --samples 8   # rows of bare instances")


def _list_all() -> None:
    table = Table(title=f"handlers (entry point group {ENTRY_POINT_GROUP})", title_justify="left")
    for column in ("name", "what", "reward", "instance"):
        table.add_column(column)
    for name in sorted(available_handlers()):
        try:
            handler = load_handler(name)
        except HandlerError as exc:
            table.add_row(name, styled(str(exc), Tone.ERROR), "-", "-")
            continue
        schema = handler.instance_schema
        keys = "no schema: not checked at submit" if schema is None else \
            ", ".join(k.name + ("*" if k.required else "") for k in schema.keys[:8]) + (" ..." if len(schema.keys) > 8 else "")
        rule = handler.reward_rule
        table.add_row(name, _summary(handler), rule.summary if rule else "not declared", keys)
    out.print(table)
    say("* required.  `hpc-rollout handlers NAME` prints one handler's reward rule and its keys with their types "
        "and meaning.")


def register(cli: click.Group) -> None:
    cli.add_command(handlers_cmd)

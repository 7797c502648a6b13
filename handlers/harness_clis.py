"""Agent CLIs the `harness` handler knows by name (`harness.cli`): how each is pointed at the job's
proxy, kept off every other network endpoint, and run without a terminal.

    claude-code   Claude Code (npm @anthropic-ai/claude-code), Anthropic Messages API
    codex         Codex CLI (npm @openai/codex), OpenAI Responses API

The relay (orchestrator/proxy/relay.py) exports the proxy's address and the job's token for both
API families (OPENAI_BASE_URL / OPENAI_API_KEY, ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY); a preset
adds the CLI's own settings (environment and configuration files, written in INIT) and its
non-interactive command line. The sandbox has no network but the proxy; the settings below
switch off what the CLIs would otherwise try to reach (telemetry, error reports, update checks,
feedback), by the CLIs' own documented settings. Both run in the `harness` image
(images/harness.def.j2).

`harness.command` replaces a preset's command line (its environment and files stay), e.g. to add
arguments; `$HPC_ROLLOUT_TASK_FILE` holds the task's text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

HARNESS_DIR = "/workspace/.harness"


@dataclass(frozen=True)
class CliSettings:
    """What of the job's harness settings a preset needs."""

    model_name: str
    max_calls: int
    max_context_tokens: int
    max_tokens_per_call: int


@dataclass(frozen=True)
class CliPreset:
    name: str
    api: str                                               # the API it speaks (docs/proxy.md)
    package: str                                           # its npm package
    env: Callable[[CliSettings], dict[str, str]]
    command: Callable[[CliSettings], str]
    files: Callable[[CliSettings], dict[str, str]] = field(default=lambda settings: {})


def claude_env(settings: CliSettings) -> dict[str, str]:
    model = settings.model_name
    return {
        "CLAUDE_CONFIG_DIR": f"{HARNESS_DIR}/claude",             # its state, outside the repository
        # = DISABLE_AUTOUPDATER + DISABLE_BUG_COMMAND + DISABLE_ERROR_REPORTING + DISABLE_TELEMETRY
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_TELEMETRY": "1",
        # Every model it would pick (main, small/fast, subagents) is the job's policy.
        "ANTHROPIC_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "CLAUDE_CODE_SUBAGENT_MODEL": model,
        # A model id it does not know: tell it the job's context and reply budgets.
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(settings.max_context_tokens),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(settings.max_tokens_per_call),
        "IS_SANDBOX": "1",   # it runs in the job's sandbox: skipping permission prompts is allowed as root
    }


def claude_command(settings: CliSettings) -> str:
    return (f'claude -p "$(cat "$HPC_ROLLOUT_TASK_FILE")" --model {settings.model_name} '
            f"--dangerously-skip-permissions --max-turns {settings.max_calls} --output-format json < /dev/null")


def codex_config(settings: CliSettings) -> str:
    """$CODEX_HOME/config.toml: the job's proxy as the only provider (its address is given on the
    command line: the relay picks a free port when the command starts)."""
    return f"""model = "{settings.model_name}"
model_provider = "hpc_rollout"
model_context_window = {settings.max_context_tokens}
approval_policy = "never"
sandbox_mode = "danger-full-access"
web_search = "disabled"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"

# Subagents come as a tool namespace and web search as a hosted tool: neither reaches a chat template.
[agents]
enabled = false

# The plugin marketplace sync looks up api.github.com at start.
[features]
plugins = false

[model_providers.hpc_rollout]
name = "hpc-rollout job proxy"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
"""


def codex_command(settings: CliSettings) -> str:
    return ('codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox '
            '-c "model_providers.hpc_rollout.base_url=\\"$OPENAI_BASE_URL\\"" '
            '"$(cat "$HPC_ROLLOUT_TASK_FILE")" < /dev/null')


PRESETS: dict[str, CliPreset] = {
    "claude-code": CliPreset("claude-code", "anthropic_messages", "@anthropic-ai/claude-code", claude_env,
                             claude_command),
    "codex": CliPreset("codex", "openai_responses", "@openai/codex",
                       lambda settings: {"CODEX_HOME": f"{HARNESS_DIR}/codex"}, codex_command,
                       lambda settings: {f"{HARNESS_DIR}/codex/config.toml": codex_config(settings)}),
}


def preset(name: str) -> CliPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"harness cli {name!r}: choose one of {', '.join(PRESETS)} (or give harness.command)") from None

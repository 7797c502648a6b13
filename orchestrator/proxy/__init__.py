"""A recording proxy per job: train any agent harness (a CLI that calls an OpenAI or Anthropic
API) token-in/token-out.

    harness in the sandbox --HTTP--> relay on the sandbox's loopback --Unix socket (bound in)-->
    JobProxy (the worker) --token ids--> the job's backend (sticky, counted, versioned)

Modules, one concept each:
    chat_form           the form every API's request takes: template messages, keys, tools
    chat_completions    OpenAI chat completions (POST /v1/chat/completions)
    anthropic_messages  Anthropic Messages (POST /v1/messages; Claude Code)
    openai_responses    OpenAI Responses (POST /v1/responses; Codex CLI)
    api                 what the server needs of each API; problems and their statuses
    bad_request         the error of a request the proxy cannot serve (400 in the API's shape)
    typed_fields        the typed fields of each API's requests (type and documented range)
    nesting             how deep a request's JSON may nest (MAX_NESTING levels)
    admission           budgets counted at admission: max_calls slots, the bodies' allowance
    recorder            messages -> ids (a call that extends the last keeps its ids verbatim and renders
                        only the new messages), one generation, the reply's tool calls; every call recorded
    trajectory          training samples from the recorded calls: per_request or prefix_merging
    server              the per-job HTTP server on a Unix socket (token + peer uid checked)
    relay               stdlib-only program run inside the sandbox: TCP on its loopback -> the socket,
                        and the harness command with OPENAI_* / ANTHROPIC_* pointing at it
    placement           where a job's proxy directory lives (its sandbox's control directory)
"""

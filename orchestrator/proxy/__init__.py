"""A recording OpenAI-compatible proxy per job: train any agent harness (a CLI that calls "an
OpenAI API") token-in/token-out.

    harness in the sandbox --HTTP--> relay on the sandbox's loopback --Unix socket (bound in)-->
    JobProxy (the worker) --token ids--> the job's backend (sticky, counted, versioned)

Modules, one concept each:
    wire        OpenAI chat-completions shapes: request parsing, message keys, replies, SSE chunks
    recorder    messages -> ids (a call that extends the last keeps its ids verbatim and renders
                only the new messages), one generation, the reply's tool calls; every call recorded
    trajectory  training samples from the recorded calls: per_request or prefix_merging
    server      the per-job HTTP server on a Unix socket (token + peer uid checked)
    relay       stdlib-only program run inside the sandbox: TCP on its loopback -> the socket,
                and the harness command with OPENAI_BASE_URL / OPENAI_API_KEY set
"""

"""The agent loop: an LLM that calls tools in the job's sandbox, turn after turn.

Modules, one concept each (the first three are pure: no sandbox, no HTTP, reusable by a
proxy that only records):
    calls       ToolCall and ParsedReply: what a parser finds in a model's reply
    parsers     tool-call parsers by name: hermes (= qwen), mistral, llama3_json
    tools       tool declarations as OpenAI function schemas, and argument checks
    messages    assistant / tool / nudge messages in the OpenAI chat shape; observation cutting
    toolbox     the tools bound to a sandbox: bash, python, str_replace_editor, think, submit, finish
    loop        the turn loop with its limits and stop reasons; per-call records
    handler     ToolAgentHandler: INIT opens the sandbox, RUN runs the loop (base of math/code/swe)
"""

"""LLM backends: the shared registry, cluster-wide routing, token-in/token-out clients,
the conversation buffer and a reference server (`hpc-rollout serve-llm`).

Modules, one concept each:
    registry      backends.json (+ lock file): add / remove / clear / swap / set_state
    inflight      per-worker in-flight counts in the spool, expiring with the worker's lease
    router        least-in-flight sticky pick, health marking and probing
    client        request loop with retries; vllm.py and sglang.py speak the protocols
    conversation  token buffer: exact ids of earlier turns, only new messages templated
    session       one task's sticky backend + failover, what a handler uses
    tiny_model    a tiny random Qwen2-style model + BPE tokenizer built offline
    server        the reference HTTP server; local_server starts one as a subprocess
    reload        the server's weight-reload routes; checkpoint reads the directory they load
"""

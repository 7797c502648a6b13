"""LLM backends, client side: the shared registry, cluster-wide routing, token-in/token-out
clients and the conversation buffer. (The reference server is in orchestrator/devserver/.)

Modules, one concept each:
    registry      backends.json (+ lock file): add / remove / clear / swap / set_state
    inflight      per-worker in-flight counts in the spool, expiring with the worker's lease
    router        least-in-flight sticky pick, health marking and probing
    client        request loop with retries; vllm.py and sglang.py speak the protocols
    conversation  token buffer: exact ids of earlier turns, only new messages templated
    session       one task's sticky backend + failover, what a handler uses
    tokenizer     loading a tokenizer from a local directory, never the network
    weights       swapping the policy's weights on every backend, then the version
"""

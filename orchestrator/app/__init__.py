"""The application layer: what runs the system on this machine for a person, on top of every part.

    local_launch  start worker processes here, watch them drain, stop them by pid
    demo          `hpc-rollout demo`: serve-llm --tiny + chat jobs on local workers
    agent_demo    `hpc-rollout demo --task math|code|swe`: bundled agent tasks in sandboxes

Nothing below this package imports it (docs/architecture.md, tests/core/test_layers.py).
"""

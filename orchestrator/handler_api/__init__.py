"""What a handler programs against: the AgentHandler contract and registry (contract.py), JobContext (context.py)."""

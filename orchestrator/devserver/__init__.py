"""The reference LLM server behind `serve-llm`, the tiny offline model, the scripted policy, the stock vLLM launcher.

Development and test scaffolding: production workers never import it (the client side is orchestrator/llm/).
"""

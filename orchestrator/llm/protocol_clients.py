"""client_for: the protocol client (vLLM or SGLang) that speaks to one backend of the registry.

Apart from client.py so that the base class does not import its own subclasses (no cycle).
"""

from __future__ import annotations

from orchestrator.llm.client import BackendClient, ModelInfoCache, RetryPolicy
from orchestrator.llm.http import BackendHttp
from orchestrator.llm.registry import Backend, Protocol
from orchestrator.llm.sglang import SGLangClient
from orchestrator.llm.vllm import VLLMClient

CLIENTS: dict[Protocol, type[BackendClient]] = {Protocol.VLLM: VLLMClient, Protocol.SGLANG: SGLangClient}


def client_for(backend: Backend, http: BackendHttp, retry: RetryPolicy | None = None,
               known: ModelInfoCache | None = None) -> BackendClient:
    """`known`: model infos shared between clients (a worker's router keeps one)."""
    return CLIENTS[backend.protocol](backend, http, retry or RetryPolicy(), known)

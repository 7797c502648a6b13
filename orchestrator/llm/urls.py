"""Endpoints of a backend from its registered URL (vLLM URLs usually end in /v1)."""

from __future__ import annotations


def server_root(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def health_url(url: str) -> str:
    return f"{server_root(url)}/health"


def endpoint(url: str, path: str) -> str:
    return f"{server_root(url)}/{path.lstrip('/')}"

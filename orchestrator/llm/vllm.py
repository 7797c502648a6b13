"""vLLM's OpenAI-compatible /v1/completions with token ids in and out.

Token ids come from `token_ids` (vLLM >= 0.10.2 with return_token_ids) or, on older servers,
from the `tokens` strings "token_id:N" (return_tokens_as_token_ids, vLLM >= 0.8.0).
Which logprobs they are (raw by vLLM's default, processed with `--logprobs-mode processed_logprobs`)
is the registry entry's `served_logprobs`, recorded at `backend add`. Weight reload uses the
dev-mode routes (VLLM_SERVER_DEV_MODE=1): /collective_rpc reload_weights, /update_weight_version;
the same mode's /abort_requests (no ids: every request in flight) ends generations early, each
answering its tokens so far with finish reason `abort`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from orchestrator.llm.client import BackendClient, Completion, require
from orchestrator.llm.errors import BackendFailed, RequestRejected

log = logging.getLogger(__name__)

TOKEN_PREFIX = "token_id:"


@dataclass
class VLLMClient(BackendClient):
    def build_request(self, model: str, prompt_ids: list[int], max_tokens: int,
                      sampling: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        body = {
            "temperature": 1.0, "top_p": 1.0, **sampling,
            "model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "n": 1,
            "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "skip_special_tokens": False, "stream": False,
        }
        return "/v1/completions", body

    def parse_response(self, body: Any) -> Completion:
        url = self.backend.url
        require(isinstance(body, dict) and bool(body.get("choices")), url,
                lambda: f"/v1/completions answered without choices: {str(body)[:200]}")
        choice = body["choices"][0]
        logprobs = choice.get("logprobs") or {}
        token_logprobs = logprobs.get("token_logprobs")
        if token_logprobs is None:
            raise BackendFailed(url, "no per-token logprobs in the answer ('logprobs': 0 ignored?)")
        ids: list[Any] | None = choice.get("token_ids")
        if ids is None:
            tokens = logprobs.get("tokens") or []
            require(all(isinstance(t, str) and t.startswith(TOKEN_PREFIX) for t in tokens), url,
                    "the server returns neither token_ids nor 'token_id:N' tokens: use vLLM >= 0.10.2, "
                    "or >= 0.8.0 (start older ones with --return-tokens-as-token-ids)")
            ids = [int(t[len(TOKEN_PREFIX):]) for t in tokens]
        require(len(ids) == len(token_logprobs), url,
                f"{len(ids)} token ids but {len(token_logprobs)} logprobs")
        return Completion(
            output_ids=[int(i) for i in ids],
            logprobs=[float(x) if x is not None else float("nan") for x in token_logprobs],
            finish_reason=str(choice.get("finish_reason") or "stop"),
            logprob_mode=self.backend.served_logprobs.value,
        )

    async def reload(self, checkpoint: str, version: int) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": checkpoint}}
        try:
            answer = await self.request("POST", "/collective_rpc", body)
        except RequestRejected as exc:
            raise self.reload_unsupported(exc) from None
        require(isinstance(answer, dict) and "results" in answer, self.backend.url,
                lambda: f"/collective_rpc answered {str(answer)[:200]}")
        try:  # only reported by the server (e.g. in /model_info); older dev modes lack it
            await self.request("POST", "/update_weight_version", {"new_version": str(version)})
        except RequestRejected as exc:
            log.info("backend %s keeps its weight version label: %s", self.backend.url, exc)

    async def abort_all(self) -> int | None:
        try:
            answer = await self.request("POST", "/abort_requests", {})
        except RequestRejected as exc:
            raise self.abort_unsupported(exc) from None
        aborted = answer.get("aborted") if isinstance(answer, dict) else None
        return int(aborted) if isinstance(aborted, int) else None

"""SGLang's native /generate with input_ids in, output ids and logprobs out.

Logprobs are SGLang's: log_softmax(logits / T), after temperature ("processed"), unless the
registry entry says otherwise (`served_logprobs`, recorded at `backend add`).
Weight reload: POST /update_weights_from_disk {model_path, weight_version}. Abort of everything in
flight: POST /abort_request {"abort_all": true}; each /generate then answers what it sampled
with finish_reason {"type": "abort"}. Each /generate carries a `rid` of its own: a generation whose
job is cancelled is aborted by it (POST /abort_request {"rid": ...}) before the job ends, since
SGLang only notices a disconnected non-streaming client when its wait for output times out.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from orchestrator.llm.client import ABORT_DEADLINE_S, BackendClient, Completion, require
from orchestrator.llm.errors import RequestRejected
from orchestrator.llm.http import HttpFailure
from orchestrator.llm.urls import endpoint

log = logging.getLogger(__name__)


@dataclass
class SGLangClient(BackendClient):
    def build_request(self, model: str, prompt_ids: list[int], max_tokens: int,
                      sampling: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        params = dict(sampling)  # SGLang shares the common names (temperature, top_p, top_k, ...)
        sampling_params = {
            "temperature": 1.0, "top_p": 1.0, **params,
            "max_new_tokens": max_tokens, "skip_special_tokens": False, "no_stop_trim": True,
        }
        body = {"input_ids": prompt_ids, "sampling_params": sampling_params,
                "return_logprob": True, "logprob_start_len": -1, "rid": uuid.uuid4().hex}
        return "/generate", body

    async def abort_request(self, body: dict[str, Any]) -> None:
        """POST /abort_request {"rid": ...}: once, briefly; a failure leaves it to the disconnect."""
        try:
            answer = await self.http.request("POST", endpoint(self.backend.url, "/abort_request"), {"rid": body["rid"]},
                                             timeout_s=ABORT_DEADLINE_S, connect_timeout_s=ABORT_DEADLINE_S)
        except (HttpFailure, TimeoutError) as exc:
            log.info("backend %s: abort of request %s failed: %s", self.backend.url, body["rid"], exc)
            return
        if answer.status >= 400:
            log.info("backend %s refused the abort of request %s: HTTP %d %s", self.backend.url, body["rid"],
                     answer.status, answer.text[:200])

    def parse_response(self, body: Any) -> Completion:
        url = self.backend.url
        if isinstance(body, list):  # a batch answer; we always send one prompt
            require(len(body) == 1, url, f"/generate answered {len(body)} results for one prompt")
            body = body[0]
        require(isinstance(body, dict) and isinstance(body.get("meta_info"), dict), url,
                lambda: f"/generate answered without meta_info: {str(body)[:200]}")
        meta = body["meta_info"]
        triples = meta.get("output_token_logprobs")
        require(isinstance(triples, list), url, "no output_token_logprobs: was return_logprob ignored?")
        ids = body.get("output_ids")
        if ids is None:
            ids = [t[1] for t in triples]
        require(len(ids) == len(triples), url, f"{len(ids)} output ids but {len(triples)} logprobs")
        require(all(int(t[1]) == int(i) for t, i in zip(triples, ids)), url,
                "output_ids and output_token_logprobs disagree")
        finish = meta.get("finish_reason")
        reason = finish.get("type") if isinstance(finish, dict) else (finish or "stop")
        version = meta.get("weight_version")
        return Completion(
            output_ids=[int(i) for i in ids],
            logprobs=[float(t[0]) for t in triples],
            finish_reason=str(reason),
            logprob_mode=self.backend.served_logprobs.value,
            weight_version=str(version) if version is not None else None,
        )

    async def reload(self, checkpoint: str, version: int) -> None:
        body = {"model_path": checkpoint, "weight_version": str(version)}
        try:
            answer = await self.request("POST", "/update_weights_from_disk", body)
        except RequestRejected as exc:
            raise self.reload_unsupported(exc) from None
        require(isinstance(answer, dict) and answer.get("success") is True, self.backend.url,
                lambda: f"/update_weights_from_disk answered {str(answer)[:300]}")

    async def abort_all(self) -> int | None:
        try:
            await self.request("POST", "/abort_request", {"rid": "", "abort_all": True})
        except RequestRejected as exc:
            raise self.abort_unsupported(exc) from None
        return None   # SGLang answers 200 with an empty body

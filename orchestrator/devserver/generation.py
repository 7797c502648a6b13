"""Batched sampling for the reference server: a manual KV-cache loop over a causal LM.

Concurrent requests are gathered into one batch (left-padded), each row with its own
temperature, top-p/top-k, seed and token budget. `abort_all()` ends every request in flight (queued
or in the batch running) before its next token: it answers what it sampled so far with finish
reason `abort`, as vLLM and SGLang do. Every sampled token comes with two
logprobs: `raw` (log_softmax of the logits, vLLM's default) and `processed` (after
temperature, SGLang's default), so the server can answer either protocol faithfully.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass
class GenResult:
    output_ids: list[int] = field(default_factory=list)
    raw_logprobs: list[float] = field(default_factory=list)
    processed_logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    matched_stop: int | None = None


class Engine:
    """Owns the model; `submit` is awaited by request handlers, batches run in a thread."""

    def __init__(self, model_dir: Path, *, max_batch: int = 8, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
        self.model.to(self.device).eval()
        config = self.model.config
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.max_batch = max_batch
        self._queue: asyncio.Queue[tuple[GenRequest, asyncio.Future[GenResult], threading.Event]] | None = None
        self._live: set[threading.Event] = set()   # one per request in flight: set = abort it
        self._loop_task: asyncio.Task[None] | None = None
        self._weights_lock: asyncio.Lock | None = None   # a batch and a weight reload never overlap
        self._default_rng = torch.Generator().manual_seed(0)

    async def submit(self, request: GenRequest) -> GenResult:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._loop_task = asyncio.create_task(self._batch_loop())
        future: asyncio.Future[GenResult] = asyncio.get_running_loop().create_future()
        abort = threading.Event()
        self._live.add(abort)
        try:
            await self._queue.put((request, future, abort))
            return await future
        finally:
            self._live.discard(abort)

    def in_flight(self) -> int:
        """Requests queued or in the batch running."""
        return len(self._live)

    def abort_all(self) -> int:
        """Abort every request in flight; how many there were."""
        live = list(self._live)
        for abort in live:
            abort.set()
        return len(live)

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                async with self.weights_lock():
                    results = await asyncio.to_thread(self.generate, [r for r, _, _ in batch], [a for _, _, a in batch])
            except Exception as exc:  # answer every waiter; the server maps it to HTTP 500
                log.exception("generation failed")
                for _, future, _ in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future, _), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

    def weights_lock(self) -> asyncio.Lock:
        if self._weights_lock is None:
            self._weights_lock = asyncio.Lock()
        return self._weights_lock

    async def reload_weights(self, directory: Path) -> float:
        """Load new weights from a checkpoint directory between two batches; seconds it took.

        The batch running now finishes on the old weights; batches after it use the new ones,
        so no request ever mixes the two. See orchestrator/devserver/reload.py and checkpoint.py.
        """
        from orchestrator.devserver.checkpoint import read_state_dict

        started = time.monotonic()
        state = await asyncio.to_thread(read_state_dict, Path(directory), self.model)
        async with self.weights_lock():
            await asyncio.to_thread(self._load_state, state)
        return time.monotonic() - started

    def _load_state(self, state: dict[str, Any]) -> None:
        with self.torch.no_grad():
            self.model.load_state_dict(state, strict=False)

    def generate(self, requests: list[GenRequest], aborts: list[threading.Event] | None = None) -> list[GenResult]:
        torch = self.torch
        with torch.inference_mode():
            return self._generate(requests, aborts or [threading.Event() for _ in requests])

    def _generate(self, requests: list[GenRequest], aborts: list[threading.Event]) -> list[GenResult]:
        torch = self.torch
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            n = len(request.prompt_ids)
            ids[row, width - n:] = torch.tensor(request.prompt_ids, dtype=torch.long)
            mask[row, width - n:] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        rngs = [
            torch.Generator().manual_seed(r.seed) if r.seed is not None else self._default_rng
            for r in requests
        ]
        results = [GenResult() for _ in requests]
        done = [r.max_tokens <= 0 for r in requests]
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=positions.to(self.device), use_cache=True)
        for _ in range(max(r.max_tokens for r in requests)):
            if all(done):
                break
            logits = out.logits[:, -1, :].float().cpu()
            raw = torch.log_softmax(logits, dim=-1)
            next_ids = []
            for row, request in enumerate(requests):
                if not done[row] and aborts[row].is_set():
                    results[row].finish_reason, done[row] = "abort", True
                if done[row]:
                    next_ids.append(self.pad_id)
                    continue
                token, processed = sample(torch, logits[row], request, rngs[row])
                result = results[row]
                result.output_ids.append(token)
                result.raw_logprobs.append(float(raw[row, token]))
                result.processed_logprobs.append(processed)
                stops = set(request.stop_token_ids) | (set() if request.ignore_eos else self.eos_ids)
                if token in stops:
                    result.finish_reason, result.matched_stop, done[row] = "stop", token, True
                elif len(result.output_ids) >= request.max_tokens:
                    done[row] = True
                next_ids.append(token)
            if all(done):
                break
            step = torch.tensor(next_ids, dtype=torch.long).unsqueeze(-1)
            mask = torch.cat([mask, torch.ones((len(requests), 1), dtype=torch.long)], dim=-1)
            positions = positions[:, -1:] + 1
            out = self.model(input_ids=step.to(self.device), attention_mask=mask.to(self.device),
                             position_ids=positions.to(self.device),
                             past_key_values=out.past_key_values, use_cache=True)
        return results


def sample(torch: Any, logits: Any, request: GenRequest, rng: Any) -> tuple[int, float]:
    """One token id and its logprob after temperature (before top-p/top-k filtering)."""
    if request.temperature <= 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, -1)[token])
    scaled = logits / request.temperature
    processed = torch.log_softmax(scaled, -1)
    filtered = scaled.clone()
    if request.top_k > 0:
        kth = torch.topk(filtered, min(request.top_k, filtered.numel())).values[-1]
        filtered[filtered < kth] = -math.inf
    if request.top_p < 1.0:
        order = torch.argsort(filtered, descending=True)
        cumulative = torch.softmax(filtered[order], -1).cumsum(-1)
        drop = cumulative - torch.softmax(filtered[order], -1) > request.top_p
        filtered[order[drop]] = -math.inf
    probs = torch.softmax(filtered, -1)
    token = int(torch.multinomial(probs, 1, generator=rng))
    return token, float(processed[token])

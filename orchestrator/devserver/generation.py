"""The reference server's engine: one causal LM, the requests in flight, continuous batching.

Requests join the running batch at its next decode step and leave it as soon as they are done
(orchestrator/devserver/running_batch.py), each with its own temperature, top-p/top-k, seed and
token budget (orchestrator/devserver/sampling.py), as vLLM and SGLang schedule. `abort_all()`
ends every request in flight (queued or running) before its next token: it answers what it
sampled so far with finish reason `abort`, as they do. A weight reload waits for the running
batch to drain, admitting nobody meanwhile, so no request mixes two sets of weights.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.devserver.running_batch import RunningBatch, check_packable
from orchestrator.devserver.sampling import GenRequest, GenResult

log = logging.getLogger(__name__)

Waiter = tuple[GenRequest, "asyncio.Future[GenResult]", threading.Event]


@dataclass
class StepCounters:
    """What the model thread did since the server started: steps, the rows they carried, their
    wall and CPU seconds (serve-llm's /metrics): fewer rows per step means the batch had holes,
    more seconds per step that the model ran slower."""

    steps: int = 0
    rows: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    def add(self, rows: int, seconds: float, cpu_seconds: float) -> None:
        self.steps += 1
        self.rows += rows
        self.seconds += seconds
        self.cpu_seconds += cpu_seconds


class Engine:
    """Owns the model; `submit` is awaited by request handlers, decode steps run in a thread."""

    def __init__(self, model_dir: Path, *, max_batch: int = 8, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        # sdpa: the running batch packs its rows behind a prepared 4D mask, which that kernel takes as is
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="sdpa")
        check_packable(self.model.config)
        self.model.to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.max_batch = max_batch
        self._queue: asyncio.Queue[Waiter] | None = None
        self._live: set[threading.Event] = set()   # one per request in flight: set = abort it
        self._loop_task: asyncio.Task[None] | None = None
        self._weights_lock: asyncio.Lock | None = None   # held while a batch runs; a reload takes it
        self._reloads_waiting = 0                        # > 0: admit nobody, so the batch drains
        self._default_rng = torch.Generator().manual_seed(0)
        self.counters = StepCounters()

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

    def _new_batch(self) -> RunningBatch[Any]:
        return RunningBatch(self.model, eos_ids=self.eos_ids, rng_for=self._rng_for)

    def _rng_for(self, request: GenRequest) -> Any:
        return self.torch.Generator().manual_seed(request.seed) if request.seed is not None else self._default_rng

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            joining = [await queue.get()]
            async with self.weights_lock():
                batch = self._new_batch()
                while joining or batch:
                    while len(batch) + len(joining) < self.max_batch and not queue.empty() and not self._reloads_waiting:
                        joining.append(queue.get_nowait())
                    entries = [(request, abort, future) for request, future, abort in joining]
                    joining = []
                    try:
                        finished = await asyncio.to_thread(self._advance, batch, entries)
                    except Exception as exc:  # answer every waiter; the server maps it to HTTP 500
                        log.exception("generation failed")
                        for future in [row.tag for row in batch.rows] + [tag for _, _, tag in entries]:
                            if not future.done():
                                future.set_exception(exc)
                        break
                    for future, result in finished:
                        if not future.done():
                            future.set_result(result)

    def _advance(self, batch: RunningBatch[Any], joining: list[tuple[GenRequest, threading.Event, Any]]) -> list[tuple[Any, GenResult]]:
        started, cpu_started = time.perf_counter(), time.thread_time()
        with self.torch.inference_mode():
            if joining:
                batch.admit(joining)
            finished = batch.step()
        self.counters.add(len(batch.rows), time.perf_counter() - started, time.thread_time() - cpu_started)
        return finished

    def weights_lock(self) -> asyncio.Lock:
        if self._weights_lock is None:
            self._weights_lock = asyncio.Lock()
        return self._weights_lock

    async def reload_weights(self, directory: Path) -> float:
        """Load new weights from a checkpoint directory between two batches; seconds it took.

        The requests running now finish on the old weights (nobody joins them meanwhile); the
        ones after use the new ones, so no request ever mixes the two. See
        orchestrator/devserver/reload.py and checkpoint.py.
        """
        from orchestrator.devserver.checkpoint import read_state_dict

        started = time.monotonic()
        state = await asyncio.to_thread(read_state_dict, Path(directory), self.model)
        self._reloads_waiting += 1
        try:
            async with self.weights_lock():
                await asyncio.to_thread(self._load_state, state)
        finally:
            self._reloads_waiting -= 1
        return time.monotonic() - started

    def _load_state(self, state: dict[str, Any]) -> None:
        with self.torch.no_grad():
            self.model.load_state_dict(state, strict=False)

    def generate(self, requests: list[GenRequest], aborts: list[threading.Event] | None = None) -> list[GenResult]:
        """Sample every request together, in this thread (tests and tools: no server)."""
        batch: RunningBatch[int] = self._new_batch()
        results: list[GenResult] = [GenResult() for _ in requests]
        aborts = aborts or [threading.Event() for _ in requests]
        with self.torch.inference_mode():
            batch.admit([(request, abort, index) for index, (request, abort) in enumerate(zip(requests, aborts))])
            while batch:
                for index, result in batch.step():
                    results[index] = result
        return results

"""The reference server's engine: one causal LM, the requests in flight, continuous batching.

Requests join the running batch at its next decode step and leave it as soon as they are done
(orchestrator/devserver/running_batch.py), each with its own temperature, top-p/top-k, seed and
token budget (orchestrator/devserver/sampling.py), as vLLM and SGLang schedule. `abort_all()`
ends every request in flight (queued or running) before its next token, `abort(rid)` the one
submitted under that id (SGLang's `rid`): it answers what it sampled so far with finish reason
`abort`, as they do. A request whose caller stops waiting (its HTTP client went away) is aborted
the same way, as vLLM and SGLang abort a disconnected request: nobody samples for nobody. A
request counts as in flight until the model thread has let go of it. A weight reload waits for
the running batch to drain, admitting nobody meanwhile, so no request mixes two sets of weights.

The steps run back to back in a thread of their own (the model thread), as vLLM's engine core
runs apart from its API server: requests reach it through a queue and answers go back to the
event loop that asked. Between two steps it waits for nobody; with each step handed to a pool
thread and awaited by the event loop, every step waited for that loop's thread to be scheduled
again, which on a busy node (the workers beside the model) made the model's steps 10% slower.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.devserver.running_batch import RunningBatch, check_packable
from orchestrator.devserver.sampling import GenRequest, GenResult

log = logging.getLogger(__name__)

Waiter = tuple[GenRequest, threading.Event, "Answer"]   # a request, its abort, where its result goes


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
    """Owns the model; `submit` is awaited by request handlers, steps run in the model thread."""

    def __init__(self, model_dir: Path, *, max_batch: int = 8, threads: int | None = None,
                 reload_delay_s: float = 0.0) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        # sdpa: the running batch hands its own 4D boolean masks (padding, packed prompts) to that kernel
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="sdpa")
        check_packable(self.model.config)
        self.model.to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.max_batch = max_batch
        # A reload holds generation this much longer once drained: the time a large checkpoint
        # takes to load (serve-llm --reload-delay-s; benchmarks/rolling.py), the tiny one's is ~0.
        self.reload_delay_s = reload_delay_s
        self.counters = StepCounters()
        # One abort per request in flight (set = abort it), kept until the model thread lets go of
        # the request: /metrics then counts what still runs, not what still has a caller.
        self._live: dict[Answer, threading.Event] = {}
        self._by_rid: dict[str, threading.Event] = {}
        # What the model thread and the others share, under `_changed`'s lock:
        self._changed = threading.Condition()
        self._pending: deque[Waiter] = deque()     # submitted, not yet in the batch
        self._reloads_waiting = 0                  # > 0: admit nobody, so the batch drains
        self._batch_running = False                # the model thread holds rows (a reload waits)
        self._thread: threading.Thread | None = None
        self._default_rng = torch.Generator().manual_seed(0)

    async def submit(self, request: GenRequest, rid: str | None = None) -> GenResult:
        """Sample `request`; `rid` names it for `abort(rid)`. Cancelled (its client went away), it
        is aborted: it leaves the batch at the next step instead of sampling on for nobody."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenResult] = loop.create_future()
        abort = threading.Event()
        answer = Answer(loop, future)
        with self._changed:
            self._live[answer] = abort
            if rid:
                self._by_rid[rid] = abort
            self._pending.append((request, abort, answer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run_steps, name="serve-llm-model", daemon=True)
                self._thread.start()
            self._changed.notify_all()
        try:
            return await future
        except asyncio.CancelledError:
            abort.set()
            raise
        finally:
            if rid:
                with self._changed:
                    self._by_rid.pop(rid, None)

    def in_flight(self) -> int:
        """Requests queued or in the batch running (an aborted one until it has left the batch)."""
        return len(self._live)

    def abort_all(self) -> int:
        """Abort every request in flight; how many there were."""
        with self._changed:
            live = list(self._live.values())
        for abort in live:
            abort.set()
        return len(live)

    def abort(self, rid: str) -> bool:
        """Abort the request submitted under `rid`; whether one was in flight."""
        with self._changed:
            abort = self._by_rid.get(rid)
        if abort is not None:
            abort.set()
        return abort is not None

    def _let_go(self, answers: list["Answer"]) -> None:
        with self._changed:
            for answer in answers:
                self._live.pop(answer, None)

    def _new_batch(self) -> RunningBatch[Any]:
        return RunningBatch(self.model, eos_ids=self.eos_ids, rng_for=self._rng_for)

    def _rng_for(self, request: GenRequest) -> Any:
        return self.torch.Generator().manual_seed(request.seed) if request.seed is not None else self._default_rng

    def _run_steps(self) -> None:
        """The model thread: admit what waits (room and no reload permitting), step, answer; again."""
        batch = self._new_batch()
        while True:
            joining = self._next_joining(batch)
            try:
                finished = self._advance(batch, joining)
            except Exception as exc:  # answer every request of the batch; the server maps it to HTTP 500
                log.exception("generation failed")
                failed = [row.tag for row in (*batch.rows, *batch.joining)] + [tag for tag, _ in batch.finished_at_once]
                failed_answers = list(dict.fromkeys([*failed, *(tag for _, _, tag in joining)]))
                self._let_go(failed_answers)
                for answer in failed_answers:
                    answer.fail(exc)
                batch = self._new_batch()
                continue
            self._let_go([answer for answer, _ in finished])
            for answer, result in finished:
                answer.give(result)

    def _next_joining(self, batch: RunningBatch[Any]) -> list[Waiter]:
        """The requests that join the batch at its next step; waits while there is nothing to do."""
        with self._changed:
            while not batch and (not self._pending or self._reloads_waiting):
                self._batch_running = False
                self._changed.notify_all()   # a reload waiting for the batch to drain
                self._changed.wait()
            self._batch_running = True
            joining: list[Waiter] = []
            while self._pending and not self._reloads_waiting and len(batch) + len(joining) < self.max_batch:
                joining.append(self._pending.popleft())
            return joining

    def _advance(self, batch: RunningBatch[Any], joining: list[Waiter]) -> list[tuple[Any, GenResult]]:
        started, cpu_started = time.perf_counter(), time.thread_time()
        with self.torch.inference_mode():
            if joining:
                batch.admit(joining)
            finished = batch.step()
        self.counters.add(len(batch.rows), time.perf_counter() - started, time.thread_time() - cpu_started)
        return finished

    async def reload_weights(self, directory: Path) -> float:
        """Load new weights from a checkpoint directory between two batches; seconds it took.

        The requests running now finish on the old weights (nobody joins them meanwhile); the
        ones after use the new ones, so no request ever mixes the two. See
        orchestrator/devserver/reload.py and checkpoint.py.
        """
        from orchestrator.devserver.checkpoint import read_state_dict

        started = time.monotonic()
        state = await asyncio.to_thread(read_state_dict, Path(directory), self.model)
        with self._changed:
            self._reloads_waiting += 1
        try:
            await asyncio.to_thread(self._wait_for_drain)
            if self.reload_delay_s > 0:   # nobody is admitted meanwhile, as a server loading a large model
                await asyncio.sleep(self.reload_delay_s)
            # the drained batch's answers were handed to their loops before the drain: this one's
            # are settled by now, so its requests have ended before the weights change
            await asyncio.to_thread(self._load_once_drained, state)
        finally:
            with self._changed:
                self._reloads_waiting -= 1
                self._changed.notify_all()
        return time.monotonic() - started

    def _wait_for_drain(self) -> None:
        with self._changed:
            while self._batch_running:
                self._changed.wait()

    def _load_once_drained(self, state: dict[str, Any]) -> None:
        with self._changed:   # held while loading: the model thread cannot start a step meanwhile
            while self._batch_running:
                self._changed.wait()
            self._load_state(state)

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


@dataclass(frozen=True, eq=False)
class Answer:
    """Where a request's result goes: its future, set in the event loop that awaits it."""

    loop: asyncio.AbstractEventLoop
    future: "asyncio.Future[GenResult]"

    def give(self, result: GenResult) -> None:
        self._settle(lambda: self.future.set_result(result))

    def fail(self, exc: BaseException) -> None:
        self._settle(lambda: self.future.set_exception(exc))

    def _settle(self, settle: Callable[[], None]) -> None:
        def in_loop() -> None:
            if not self.future.done():   # its request may have been cancelled meanwhile
                settle()
        try:
            self.loop.call_soon_threadsafe(in_loop)
        except RuntimeError:   # that loop is closed: nobody waits any more
            pass

"""The reference server's engine schedules as vLLM and SGLang do: a request joins the running
batch at its next step and leaves it when done, without changing what the others sample."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.devserver.generation import Engine
from orchestrator.devserver.sampling import GenRequest, GenResult
from orchestrator.devserver.tiny_model import tiny_model_dir

LONG = GenRequest((5, 6, 7), 300, seed=11, ignore_eos=True)


def test_a_request_arriving_mid_batch_is_answered_before_the_batch_ends() -> None:
    # With a batch that only took newcomers once it had ended, the short request waited for the
    # long one's 300 tokens: staggered clients looked slower than a burst of the same requests.
    engine = Engine(tiny_model_dir(), threads=1, max_batch=4)

    async def race() -> list[tuple[str, float]]:
        finished: list[tuple[str, float]] = []

        async def timed(name: str, request: GenRequest) -> GenResult:
            result = await engine.submit(request)
            finished.append((name, time.monotonic()))
            return result

        long = asyncio.create_task(timed("long", LONG))
        while engine.in_flight() == 0:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)   # the long one is sampling by now
        short = await timed("short", GenRequest((9, 10, 11, 12, 13, 14, 15, 16), 2, seed=3, ignore_eos=True))
        assert len(short.output_ids) == 2
        assert len((await long).output_ids) == 300
        return finished

    assert [name for name, _ in asyncio.run(race())] == ["short", "long"]


def test_rows_joining_and_leaving_do_not_change_a_rows_samples() -> None:
    engine = Engine(tiny_model_dir(), threads=1, max_batch=8)
    alone = engine.generate([LONG])[0]

    async def crowded() -> GenResult:
        long = asyncio.create_task(engine.submit(LONG))
        while engine.in_flight() == 0:
            await asyncio.sleep(0.001)
        for wave in range(3):   # rows with longer prompts join and leave around it
            await asyncio.sleep(0.02)
            await asyncio.gather(*(engine.submit(GenRequest(tuple(range(20, 40 + 7 * k)), 3 + 5 * k, seed=wave * 10 + k))
                                   for k in range(3)))
        return await long

    together = asyncio.run(crowded())
    assert together.output_ids == alone.output_ids
    assert max(abs(a - b) for a, b in zip(together.raw_logprobs, alone.raw_logprobs)) < 1e-4


def test_prompts_joining_together_are_not_packed_into_one_quadratic_pass() -> None:
    """Eight prompts of 600 tokens joining at once: packed into one sequence of 4,800 tokens, their
    pass scored 4,800 x 4,800 pairs (8x the 8 x 600 x 600 of their own causal passes; 64 prompts of
    4k tokens would ask for 65 G mask entries): each prompt goes through the model on its own, and
    their samples are the ones each gets alone."""
    engine = Engine(tiny_model_dir(), threads=1, max_batch=8)
    requests = [GenRequest(tuple(5 + (i * 7 + k) % 50 for k in range(600)), 4, seed=i, ignore_eos=True)
                for i in range(8)]
    alone = [engine.generate([request])[0] for request in requests[:2]]
    widest: list[int] = []
    forward = engine.model.forward

    def recording(*args, **kwargs):
        widest.append(kwargs["input_ids"].shape[-1])
        return forward(*args, **kwargs)

    engine.model.forward = recording
    together = engine.generate(requests)
    assert max(widest) == 600, f"a forward pass fed {max(widest)} tokens at once"
    for one, crowded in zip(alone, together):
        assert crowded.output_ids == one.output_ids
        assert max(abs(a - b) for a, b in zip(crowded.raw_logprobs, one.raw_logprobs)) < 1e-4
    widest.clear()   # short prompts still share a pass: a pass's fixed cost is most of theirs
    engine.generate([GenRequest(tuple(range(5, 12)), 2, seed=i, ignore_eos=True) for i in range(8)])
    assert widest[0] == 8 * 7


def test_a_decode_step_attends_over_its_own_row_not_the_whole_batch() -> None:
    """Each running row's next token looks at its own row's cache: the keys a decode step scores per
    token are the longest row's, not every row's (packed into one sequence, 32 rows of 600 tokens
    scored 32 x 19,200 pairs a step instead of 32 x 600: 2.3x transformers' generate)."""
    engine = Engine(tiny_model_dir(), threads=1, max_batch=8)
    requests = [GenRequest(tuple(5 + (i * 3 + k) % 40 for k in range(300 + 10 * i)), 3, seed=i, ignore_eos=True)
                for i in range(8)]
    alone = [engine.generate([request])[0] for request in requests[:2]]
    keys: list[int] = []
    forward = engine.model.forward

    def recording(*args, **kwargs):
        if kwargs["input_ids"].numel() <= len(requests):   # a decode step: a token per running row
            keys.append(kwargs["attention_mask"].shape[-1])
        return forward(*args, **kwargs)

    engine.model.forward = recording
    together = engine.generate(requests)
    assert keys and max(keys) <= 370 + 3, f"a decode step scored {max(keys)} keys per token"
    for one, crowded in zip(alone, together):
        assert crowded.output_ids == one.output_ids
        assert max(abs(a - b) for a, b in zip(crowded.raw_logprobs, one.raw_logprobs)) < 1e-4


def test_a_short_row_samples_the_same_when_the_longest_row_beside_it_leaves() -> None:
    """The batch pads every row to the longest; when that row leaves, the padding columns are cut
    and a 1-token row's samples must not move (nor when it is alone)."""
    engine = Engine(tiny_model_dir(), threads=1, max_batch=4)
    short = GenRequest((9,), 40, seed=5, ignore_eos=True)
    long = GenRequest(tuple(5 + k % 60 for k in range(700)), 2, seed=6, ignore_eos=True)
    alone = engine.generate([short])[0]
    together = engine.generate([long, short, long])
    assert together[1].output_ids == alone.output_ids
    assert max(abs(a - b) for a, b in zip(together[1].raw_logprobs, alone.raw_logprobs)) < 1e-4
    assert [len(r.output_ids) for r in together] == [2, 40, 2]


def test_a_reload_waits_for_the_running_requests_and_admits_nobody_meanwhile() -> None:
    engine = Engine(tiny_model_dir(), threads=1, max_batch=4)
    seen_at_reload: list[tuple[bool, bool]] = []

    async def scenario() -> GenResult:
        original = engine._load_state
        first = asyncio.create_task(engine.submit(LONG))
        while engine.in_flight() == 0:
            await asyncio.sleep(0.001)
        reload = asyncio.create_task(engine.reload_weights(tiny_model_dir()))
        while not engine._reloads_waiting:   # the reload has its state and waits for the batch
            await asyncio.sleep(0.001)
        later = asyncio.create_task(engine.submit(GenRequest((3, 4), 2, seed=1)))

        def load(state: dict) -> None:
            seen_at_reload.append((first.done(), later.done()))
            original(state)

        engine._load_state = load  # type: ignore[method-assign]
        await reload
        assert not first.cancelled()
        return await later

    # the running request ends on the old weights; the one that came during the wait gets the new ones
    assert len(asyncio.run(scenario()).output_ids) == 2
    assert seen_at_reload == [(True, False)]


def test_a_model_with_sliding_window_layers_is_refused_with_what_to_use_instead() -> None:
    from transformers import Qwen2Config

    from orchestrator.devserver.running_batch import UnpackableModelError, check_packable

    check_packable(Qwen2Config(num_hidden_layers=2))   # the tiny model's kind: full attention
    windowed = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=64, max_window_layers=0)
    with pytest.raises(UnpackableModelError, match="full-attention models only.*stock vLLM or SGLang"):
        check_packable(windowed)


def test_the_servers_metrics_count_its_steps_and_the_rows_they_carried(tmp_path) -> None:
    """serve-llm's /metrics says how full its batches ran (serve_llm:step_rows_total over
    serve_llm:steps_total) and how long its steps took: a benchmark reads it to tell a batch with
    holes from a model slowed by its neighbours."""
    import httpx

    from orchestrator.devserver.local_server import local_server

    def counters(url: str) -> dict[str, float]:
        page = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
        return {line.split("{")[0].removeprefix("serve_llm:"): float(line.rsplit(" ", 1)[1])
                for line in page.splitlines() if line.startswith("serve_llm:")}

    with local_server(extra_args=["--max-batch", "4"]) as url:
        assert counters(url) == {"steps_total": 0, "step_rows_total": 0, "step_seconds_total": 0,
                                 "step_cpu_seconds_total": 0}

        async def four_together() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                answers = await asyncio.gather(*(client.post(f"{url}/completions", json={
                    "prompt": [5, 6, 7 + i], "max_tokens": 6, "ignore_eos": True}) for i in range(4)))
                assert all(a.status_code == 200 for a in answers)

        asyncio.run(four_together())
        seen = counters(url)
    # 4 requests x 6 tokens: each row goes through the model 6 times (its prompt, then 5 sampled tokens)
    assert seen["step_rows_total"] == 24
    # A request takes 7 steps: its prompt's forward pass, then 6 samplings, the last with no forward
    # pass after it (the row has left): 7 steps when the four run together, 28 when a loaded
    # machine lets them in one after the other (seen in a CI-like run at load 8).
    assert 7 <= seen["steps_total"] <= 28 and seen["step_seconds_total"] >= seen["step_cpu_seconds_total"] * 0.5 > 0


def test_the_model_steps_on_while_the_servers_event_loop_is_busy() -> None:
    """The steps run back to back in the model thread, as vLLM's engine core runs apart from its
    API server: a step handed to a pool thread and awaited by the event loop waited, after every
    step, for that loop's thread to be scheduled again (on a node busy with workers, 10% slower)."""
    engine = Engine(tiny_model_dir(), threads=1, max_batch=4)

    async def scenario() -> tuple[int, int]:
        running = asyncio.create_task(engine.submit(LONG))
        while engine.counters.steps < 3:
            await asyncio.sleep(0.001)
        before = engine.counters.steps
        time.sleep(0.5)   # the event loop's thread is busy (HTTP, say): no await for half a second
        during = engine.counters.steps - before
        engine.abort_all()
        await running
        return before, during

    before, during = asyncio.run(scenario())
    assert during >= 10, f"{during} steps while the event loop was busy"

"""Token-in/token-out clients: vLLM (real tiny server, new and legacy answers) and SGLang (stand-in)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import orjson
import pytest

from orchestrator.llm.client import RetryPolicy
from orchestrator.llm.protocol_clients import client_for
from orchestrator.llm.errors import BackendFailed, RequestRejected
from orchestrator.llm.http import BackendHttp
from orchestrator.devserver.local_server import local_server
from orchestrator.llm.registry import Backend, BackendRegistry, BackendState, Protocol
from orchestrator.llm.router import Router
from orchestrator.llm.session import LLMSession
from tests.llm.helpers import heartbeat, run_dir
from tests.llm.standin import StandIn

FAST = RetryPolicy(attempts=3, backoff_s=0.01, timeout_s=30)


async def tasks_in_turn(router: Router, count: int) -> list[str]:
    """`count` one-turn tasks on `router`, one after the other, as a worker's tasks run; their models."""
    models = []
    for index in range(count):
        async with LLMSession(router, job_id=f"j{index}", retry=FAST) as llm:
            models.append((await llm.generate([1, 2], {"max_tokens": 1})).model)
    return models


async def generate(backend: Backend, prompt: list[int], sampling: dict, retry: RetryPolicy = FAST):
    async with BackendHttp() as http:
        return await client_for(backend, http, retry).generate(prompt, sampling)


def test_vllm_client_new_and_legacy_servers(tmp_path: Path) -> None:
    prompt = [1, 2673, 205, 63]
    for legacy in (False, True):
        record = tmp_path / f"record-{legacy}.jsonl"
        extra = ["--legacy-vllm"] if legacy else []
        with local_server(record=record, extra_args=extra + ["--max-model-len", "64"]) as url:
            backend = Backend(url=url)
            completion = asyncio.run(generate(backend, prompt, {"max_tokens": 8, "seed": 3, "top_k": 50}))
            capped = asyncio.run(generate(backend, list(range(1, 61)), {"max_tokens": 100}))
            full = asyncio.run(generate(backend, list(range(1, 65)), {"max_tokens": 5}))
            root = url.removesuffix("/v1")
            models = httpx.get(f"{url}/models").json()["data"][0]
            tokens = httpx.post(f"{root}/tokenize", json={"prompt": "def f(x):"}).json()
            text = httpx.post(f"{root}/detokenize", json={"tokens": tokens["tokens"]}).json()
            too_long = httpx.post(f"{url}/completions", json={"prompt": list(range(1, 70)), "max_tokens": 1})
        assert models["max_model_len"] == 64 and Path(models["id"]).is_dir()
        assert text["prompt"] == "def f(x):" and tokens["count"] == len(tokens["tokens"])
        assert too_long.status_code == 400 and "maximum context length" in too_long.text
        truth = [orjson.loads(line) for line in record.read_bytes().splitlines()]
        assert completion.output_ids == truth[0]["output_ids"] and len(completion.output_ids) == 8
        assert completion.logprobs == truth[0]["logprobs"] and completion.logprob_mode == "raw"
        assert completion.finish_reason in ("length", "stop")
        assert len(capped.output_ids) <= 4  # max_tokens capped by the context left (64 - 60)
        assert full.output_ids == [] and full.finish_reason == "length"  # nothing sent, nothing sampled
        assert len(truth) == 2


def test_sglang_client_speaks_generate() -> None:
    with StandIn() as server:
        backend = Backend(url=server.url, protocol=Protocol.SGLANG)
        completion = asyncio.run(generate(backend, [5, 6, 7], {"max_tokens": 3, "temperature": 0.5, "top_k": 4}))
        sent = server.requests[-1]
    assert completion.output_ids == [8, 9, 10]
    assert completion.logprobs == [-0.1, -0.2, -0.3]
    assert completion.finish_reason == "length" and completion.weight_version == "7"
    assert completion.logprob_mode == "processed"
    rid = sent.pop("rid")   # its own id, for /abort_request when its job is cancelled
    assert isinstance(rid, str) and len(rid) == 32
    assert sent == {
        "input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": -1,
        "sampling_params": {"temperature": 0.5, "top_p": 1.0, "top_k": 4, "max_new_tokens": 3,
                            "skip_special_tokens": False, "no_stop_trim": True},
    }


def test_sglang_context_cap_and_retries() -> None:
    with StandIn(max_model_len=64, fail_next=2) as server:
        backend = Backend(url=server.url, protocol=Protocol.SGLANG, model="standin-model")
        completion = asyncio.run(generate(backend, list(range(60)), {"max_tokens": 50}))
        assert len(completion.output_ids) == 4  # 64 - 60 left
        assert len(server.requests) == 3  # two 503s retried with backoff
        server.fail_next = 5
        with pytest.raises(BackendFailed, match="HTTP 503.*after 3 attempts"):
            asyncio.run(generate(backend, [1], {"max_tokens": 2}))


def test_real_server_generate_endpoint_matches_sglang_shape(tmp_path: Path) -> None:
    with local_server(record=tmp_path / "r.jsonl", extra_args=["--weight-version", "5"]) as url:
        backend = Backend(url=url.removesuffix("/v1"), protocol=Protocol.SGLANG)
        completion = asyncio.run(generate(backend, [1, 2, 3], {"max_tokens": 6, "temperature": 0.7}))
    truth = orjson.loads((tmp_path / "r.jsonl").read_bytes().splitlines()[0])
    assert truth["endpoint"] == "/generate"
    assert completion.output_ids == truth["output_ids"] and completion.logprobs == truth["logprobs"]
    assert completion.weight_version == "5"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_session_moves_to_another_backend_when_its_backend_fails(tmp_path: Path) -> None:
    paths = run_dir(tmp_path)
    heartbeat(paths, "w1")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    events: list = []
    with StandIn() as server:
        registry = BackendRegistry.of(paths)
        registry.add(dead, protocol="sglang", model="m", node="here")
        registry.add(server.url, protocol="sglang", node="elsewhere")
        router = Router(paths, "w1", node="here")

        async def task():
            async with LLMSession(router, job_id="j", event=lambda n, **f: events.append((n, f)),
                                  retry=FAST) as llm:
                first = await llm.generate([1, 2], {"max_tokens": 2})
                second = await llm.generate([1, 2, 3, 4, 5], {"max_tokens": 2})
                return first, second, llm.failed

        first, second, failed = asyncio.run(task())
    assert first.switched_from == dead and first.backend == server.url
    assert second.backend == server.url and second.switched_from is None
    assert failed == [dead]
    assert [name for name, _ in events] == ["llm_backend", "llm_backend_failed", "llm_backend"]
    assert registry.read().find(dead).state.value == "down"
    assert router.board.inflight == {}  # the slot was released at the end


def test_bad_request_is_not_retried() -> None:
    with StandIn() as server:
        backend = Backend(url=server.url, protocol=Protocol.VLLM, model="x")  # wrong protocol: 404
        with pytest.raises(RequestRejected, match="HTTP 404"):
            asyncio.run(generate(backend, [1], {}))


def count_ca_bundle_loads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every load of a CA bundle into a TLS context from now on (what building one costs)."""
    import ssl

    loads: list[object] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args or kwargs)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    return loads


def test_sessions_share_one_tls_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TLS context loads the CA bundle (tens of ms of CPU): once per worker, not once per task."""
    loads = count_ca_bundle_loads(monkeypatch)
    paths = run_dir(tmp_path)
    heartbeat(paths, "w1")
    with StandIn() as server:
        BackendRegistry.of(paths).add(server.url, protocol="sglang", model="m")
        router = Router(paths, "w1", node="here")
        asyncio.run(tasks_in_turn(router, 4))
    assert len(loads) <= 1, f"the CA bundle was loaded {len(loads)} times for 4 tasks"


def test_the_tls_trust_is_the_sites_when_it_names_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SSL_CERT_FILE (a site's own CAs) is the trust of backend calls when set, as it was with
    httpx; certifi's bundle otherwise."""
    import certifi

    from orchestrator.llm.http import shared_tls

    site_bundle = tmp_path / "site-ca.pem"
    site_bundle.write_bytes(Path(certifi.where()).read_bytes())
    for wanted, env in ((str(site_bundle), {"SSL_CERT_FILE": str(site_bundle)}), (certifi.where(), {})):
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        loads = count_ca_bundle_loads(monkeypatch)
        shared_tls.cache_clear()
        try:
            shared_tls()
        finally:
            shared_tls.cache_clear()
        assert [args[0] for args in loads] == [wanted], loads


def test_model_id_is_asked_once_per_registry_entry_not_once_per_task(tmp_path: Path) -> None:
    """/v1/models costs a round trip to a busy server before a task's first turn: a worker asks
    once per backend entry; an entry added again (a restarted server) is asked again."""
    paths = run_dir(tmp_path)
    heartbeat(paths, "w1")
    with StandIn() as server:
        registry = BackendRegistry.of(paths)
        registry.add(server.url, protocol="sglang")   # no model id registered: it must be asked
        router = Router(paths, "w1", node="here")
        assert asyncio.run(tasks_in_turn(router, 4)) == ["standin-model"] * 4
        assert server.model_lists == 1
        registry.remove(server.url)
        registry.add(server.url, protocol="sglang")
        assert asyncio.run(tasks_in_turn(router, 2)) == ["standin-model"] * 2
        assert server.model_lists == 2


def test_router_health_checks_and_probes_share_the_tls_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/health before a pick and probes of down backends use the sessions' TLS context too."""
    loads = count_ca_bundle_loads(monkeypatch)
    paths = run_dir(tmp_path)
    heartbeat(paths, "w1")
    with StandIn() as server:
        registry = BackendRegistry.of(paths)
        registry.add(server.url, protocol="sglang", model="m")
        router = Router(paths, "w1", node="here", health_check_s=1e-9, probe_after_s=0.0)

        async def checks_and_probes() -> None:
            for _ in range(3):   # each pick is due a /health check
                router.release((await router.acquire()).url)
            for _ in range(2):
                registry.set_state(server.url, BackendState.DOWN, "test")
                assert (await router.probe_down(registry.read())).find(server.url).state is BackendState.UP

        asyncio.run(checks_and_probes())
        checks = server.health_checks
    assert checks == 5
    assert len(loads) <= 1, f"the CA bundle was loaded {len(loads)} times for {checks} health checks"


def test_a_workers_tasks_share_keep_alive_connections(tmp_path: Path) -> None:
    """Tasks one after the other reuse one connection (no connect and close per task), and a
    worker's closing router closes it."""
    paths = run_dir(tmp_path)
    heartbeat(paths, "w1")
    with StandIn() as server:
        BackendRegistry.of(paths).add(server.url, protocol="sglang", model="m")
        router = Router(paths, "w1", node="here")

        async def tasks() -> bool:
            await tasks_in_turn(router, 4)
            client = router.connections.client()
            await router.close()
            return client.closed

        assert asyncio.run(tasks())
        assert len(server.peers) == 4 and len(set(server.peers)) == 1, server.peers
        # a second event loop (another asyncio.run) gets connections of its own, not the closed ones
        asyncio.run(tasks())
        assert len(server.peers) == 8 and server.peers[4] != server.peers[0]


def test_the_shared_connections_do_not_queue_a_big_run_pool(tmp_path: Path) -> None:
    """A pool bounded at 100 connections (httpx's default, aiohttp's too) would queue the rest: a
    worker with a run pool of 150 must still have its 150 requests at the backend at once."""
    from aiohttp import web

    from tests.llm.app_thread import AppThread

    wanted = 150
    arrived: list[int] = []
    everyone = asyncio.Event()

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        arrived.append(1)
        if len(arrived) >= wanted:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), timeout=20)
        out = [body["input_ids"][-1] + 1]
        return web.json_response({"text": "x", "output_ids": out, "meta_info": {
            "id": "x", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 1,
            "completion_tokens": 1, "output_token_logprobs": [[-0.1, out[0], None]]}})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 64}]})

    app = web.Application()
    app.add_routes([web.post("/generate", generate), web.get("/v1/models", models)])
    paths = run_dir(tmp_path)
    heartbeat(paths, "w1")
    with AppThread(app) as url:
        BackendRegistry.of(paths).add(url, protocol="sglang", model="m")
        router = Router(paths, "w1", node="here")

        async def one(index: int) -> None:
            async with LLMSession(router, job_id=f"j{index}", retry=FAST) as llm:
                await llm.generate([1, 2], {"max_tokens": 1})

        async def tasks() -> None:
            try:
                await asyncio.gather(*(one(i) for i in range(wanted)))
            finally:
                await router.close()

        asyncio.run(tasks())
    assert len(arrived) == wanted


class _CountsRenders(dict):
    """An answer that counts how often it is rendered as text."""

    renders = 0

    def __repr__(self) -> str:
        type(self).renders += 1
        return super().__repr__()

    __str__ = __repr__


def test_parsing_an_answer_renders_it_as_text_only_to_report_it_broken() -> None:
    """A worker parses an answer per sample: quoting the whole answer into an error message it
    then does not raise cost as much as the parse itself (py-spy: 3% of a busy worker)."""
    from orchestrator.llm.sglang import SGLangClient
    from orchestrator.llm.vllm import VLLMClient

    vllm = VLLMClient(Backend(url="http://x:1/v1"), BackendHttp())
    good = _CountsRenders(choices=[{"token_ids": [5, 6], "finish_reason": "length",
                                     "logprobs": {"token_logprobs": [-0.5, -0.25]}}])
    assert vllm.parse_response(good).output_ids == [5, 6]
    sglang = SGLangClient(Backend(url="http://x:1", protocol=Protocol.SGLANG), BackendHttp())
    answer = _CountsRenders(output_ids=[7], meta_info={"output_token_logprobs": [[-0.1, 7, None]], "finish_reason": "stop"})
    assert sglang.parse_response(answer).output_ids == [7]
    assert _CountsRenders.renders == 0
    with pytest.raises(BackendFailed, match="answered without choices: {'object': 'error'"):
        vllm.parse_response(_CountsRenders(object="error"))
    with pytest.raises(BackendFailed, match="answered without meta_info"):
        sglang.parse_response(_CountsRenders(text="?"))
    assert _CountsRenders.renders == 2

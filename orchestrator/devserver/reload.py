"""Weight reload for serve-llm, on the wire formats of the real servers (one client path for all).

    POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}
         -> {"results": [null]}                    vLLM's dev-mode route (VLLM_SERVER_DEV_MODE=1)
    POST /update_weights_from_disk {"model_path": DIR, "weight_version": "4"}
         -> {"success": true, "message": ..., "num_paused_requests": 0}          SGLang's
    POST /update_weight_version {"new_version": "4"} -> {"success": true, "new_version": "4"}

DIR is a checkpoint directory (`save_pretrained` output: *.safetensors, or pytorch_model.bin)
with the served model's parameter names and shapes. The server keeps answering during a
reload: the batch running finishes on the old weights, the next batches use the new ones.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from orchestrator.devserver.checkpoint import CheckpointError
from orchestrator.llm.request_body import read_body

if TYPE_CHECKING:
    from orchestrator.devserver.server import ReferenceServer

log = logging.getLogger(__name__)


async def _reload(server: "ReferenceServer", directory: Any) -> float:
    if not isinstance(directory, str) or not directory:
        raise CheckpointError("give the checkpoint directory (weights_path / model_path)")
    reload = getattr(server.engine, "reload_weights", None)
    if reload is None:
        raise CheckpointError("this server runs a scripted policy (--scripted): it has no weights to reload")
    seconds = await reload(Path(directory))
    log.warning("reloaded weights from %s in %.3f s", directory, seconds)
    return seconds


async def collective_rpc(server: "ReferenceServer", http: web.Request) -> web.Response:
    body = await read_body(http)
    if body.get("method") != "reload_weights":
        raise web.HTTPBadRequest(text=f"method {body.get('method')!r} is not supported here; supported: reload_weights")
    kwargs = body.get("kwargs") or {}
    try:
        await _reload(server, kwargs.get("weights_path") or str(server.options.model_dir))
    except CheckpointError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    return web.json_response({"results": [None]})


async def update_weights_from_disk(server: "ReferenceServer", http: web.Request) -> web.Response:
    body = await read_body(http)
    try:
        seconds = await _reload(server, body.get("model_path"))
    except CheckpointError as exc:
        return web.json_response({"success": False, "message": str(exc), "num_paused_requests": 0}, status=400)
    if body.get("weight_version") is not None:
        server.weight_version = str(body["weight_version"])
    return web.json_response({"success": True, "message": f"loaded {body['model_path']} in {seconds:.3f} s",
                              "num_paused_requests": 0})


async def update_weight_version(server: "ReferenceServer", http: web.Request) -> web.Response:
    body = await read_body(http)
    if body.get("new_version") is None:
        raise web.HTTPBadRequest(text="missing 'new_version'")
    server.weight_version = str(body["new_version"])
    return web.json_response({"success": True, "new_version": server.weight_version,
                              "message": f"weight version updated to {server.weight_version}", "time": time.time()})


def add_reload_routes(app: web.Application, server: "ReferenceServer") -> None:
    app.add_routes([
        web.post("/collective_rpc", lambda r: collective_rpc(server, r)),
        web.post("/update_weights_from_disk", lambda r: update_weights_from_disk(server, r)),
        web.post("/update_weight_version", lambda r: update_weight_version(server, r)),
    ])

"""verl's own rollout servers in the spool's registry, and the policy version after each weight update.

When verl starts vLLM/SGLang servers (RayPPOTrainer's LLMServerManager), its `llm_client` holds a
load balancer that knows their addresses ("host:port"); each is registered as
`http://host:port/v1` with verl's protocol (rollout.name), the trainer's tokenizer (model.path) and
the logprobs verl configured them for (rollout.logprobs_mode; SGLang: processed). Our workers
then sample from verl's servers, token-in/token-out, like from any other backend.

Weights: verl's CheckpointEngineManager pushes new weights into those servers after each actor
update (update_weights(global_steps)); the manager cannot see that call, but the next batch says
its step: a training batch at global step g is sampled by the weights of step g - 1 (the initial
update_weights(0) before step 1), a validation batch at step g by those of step g. The manager
moves the registered servers to that version before submitting (set_versions, with
min_policy_version = version - max_policy_lag), so every row carries the policy that sampled it.

When verl gives no servers (llm_client None, or one without a load balancer: our tests), the
backends already registered in the spool serve, and the version is the registry's.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.llm.logprob_mode import LogprobMode
from orchestrator.llm.registry import BackendRegistry, Protocol
from orchestrator.spool.staleness import staleness_floor
from orchestrator.trainer.verl.settings import ManagerSettings

log = logging.getLogger(__name__)


async def verl_server_addresses(llm_client: Any) -> list[str]:
    """The "host:port" of every server behind verl's LLMServerClient; [] when it has none."""
    balancer = getattr(llm_client, "_load_balancer", None)   # verl 0.9.1 keeps the handle here
    if balancer is None or not hasattr(balancer, "get_all_servers"):
        return []
    return [str(a) for a in await balancer.get_all_servers.remote()]


def register_verl_servers(registry: BackendRegistry, addresses: list[str], settings: ManagerSettings) -> list[str]:
    """Register each address; the URLs registered."""
    protocol = Protocol.SGLANG if settings.server_protocol == "sglang" else Protocol.VLLM
    mode = LogprobMode.PROCESSED if protocol is Protocol.SGLANG else settings.logprobs_mode
    urls = []
    for address in addresses:
        entry = registry.add(f"http://{address}/v1", protocol=protocol, tokenizer=settings.tokenizer,
                             logprob_mode=mode)
        urls.append(entry.url)
        log.info("registered verl's rollout server %s (%s, %s logprobs)", entry.url, protocol.value, mode.value)
    return urls


def policy_version_of(meta_info: dict[str, Any]) -> int | None:
    """The policy that samples a batch, from its `global_steps` (see the module doc); None: unknown."""
    step = meta_info.get("global_steps")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    return step if meta_info.get("validate") else max(0, step - 1)


def move_to_version(registry: BackendRegistry, urls: list[str], version: int, max_policy_lag: int | None) -> None:
    """The registered verl servers serve `version` now (called before a batch is submitted)."""
    if not urls or version == registry.read().policy_version:
        return
    floor = staleness_floor(version, max_policy_lag)
    registry.set_versions(urls, version, min_version=max(0, floor) if floor is not None else None)

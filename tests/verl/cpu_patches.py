"""What lets verl 0.9.1's real FSDP actor train on a machine without a GPU: tests only.

verl has no CPU platform: without a GPU it falls back to its CUDA platform (device "cuda",
torch.cuda, NCCL), and torch's CPU build has none of them. These patches are applied in the
test's driver process and, as Ray's `worker_process_setup_hook`, in every Ray worker it starts,
and nowhere else:

1. a CPU platform, registered through verl's own platform plugin registry and chosen with verl's
   `VERL_PLATFORM` (device "cpu", torch.cpu, gloo), and `VERL_ENGINE_DEVICE=cuda`, verl's own
   override of the device that selects the training engine (the FSDP engine is registered for
   "cuda" only);
2. `torch._C._cuda_setDevice`: a no-op (torch.cuda.set_device is called outside the platform);
3. attention: `sdpa`, padding removal off (flash-attention 2 does not exist on CPU); set by the
   test's config (`override_config.attn_implementation`, `use_remove_padding=false`);
4. the torch.cpu memory statistics verl logs (`memory_allocated`, `mem_get_info`, ...): zeros,
   since torch.cpu has none;
5. the resource pool's GPU count: verl's ResourcePoolManager checks that Ray has as many GPUs as
   processes asked for; here it counts Ray's CPUs;
6. a gloo process group: verl's workers open "cpu:gloo,<device>:<nccl>"; here gloo alone.

For verl's v1 trainer (`no_rollout_replicas`, in the driver process only):
7. verl's colocated vLLM replicas do not exist here (no vLLM, no GPU): the trainer class that
   verl's `get_trainer_cls` returns gets `_enable_hybrid_replicas = False`, verl's own switch for
   trainers that start none (its LLMServerManager is then empty), and the replica class verl
   looks up by `rollout.name` (importing vLLM) is verl's base RolloutReplica, never instantiated;
8. the weight sync to those replicas (verl's CheckpointEngineManager, `naive` backend, which the v1
   trainer builds whatever checkpoint_manager_class says) is the spool's SpoolCheckpointManager,
   which pushes every update to the spool's registered backends (set by the driver, fit_run.py).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

ENGINE_DEVICE = "cuda"
PLATFORM = "cpu"


def apply() -> None:
    """Apply every patch of the module doc (idempotent)."""
    os.environ["VERL_ENGINE_DEVICE"] = ENGINE_DEVICE
    os.environ["VERL_PLATFORM"] = PLATFORM
    import torch

    torch._C._cuda_setDevice = lambda device: None
    _register_cpu_platform(torch)
    _zero_memory_statistics(torch)
    _count_cpus_as_gpus()
    _gloo_process_group()


def _register_cpu_platform(torch: Any) -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    if PlatformRegistry.get(PLATFORM) is not None:
        return

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):  # type: ignore[misc]
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = torch.cpu

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:   # what tensors are moved to: `.to(get_device_id())`
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {"num_cpus": num_gpus}

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None


def no_rollout_replicas(v1: Any) -> None:
    """Patch 7 of the module doc, on verl's `verl.trainer.ppo.v1` module."""
    from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

    original = getattr(v1, "_hpc_rollout_original", v1.get_trainer_cls)
    v1._hpc_rollout_original = original

    def without_replicas(name: str) -> Any:
        return type(f"{original(name).__name__}NoReplicas", (original(name),), {"_enable_hybrid_replicas": False})

    v1.get_trainer_cls = without_replicas
    RolloutReplicaRegistry.register("vllm", lambda: RolloutReplica)


def _zero_memory_statistics(torch: Any) -> None:
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(torch.cpu, name, lambda *args, **kwargs: 0)
    torch.cpu.mem_get_info = lambda *args, **kwargs: (0, 0)
    torch.cpu.memory_stats = lambda *args, **kwargs: {}
    for name in ("empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats", "ipc_collect",
                 "set_per_process_memory_fraction"):
        setattr(torch.cpu, name, lambda *args, **kwargs: None)


def _count_cpus_as_gpus() -> None:
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager

    def check_resource_available(self: Any) -> None:
        import ray

        wanted = sum(n for nodes in self.resource_pool_spec.values() for n in nodes)
        if ray.available_resources().get("CPU", 0) < wanted:
            raise ValueError(f"Ray has fewer CPUs than the {wanted} processes asked for")

    ResourcePoolManager._check_resource_available = check_resource_available


def _gloo_process_group() -> None:
    import verl.utils.distributed as distributed
    from verl.workers import engine_workers

    original = getattr(distributed, "_hpc_rollout_original", distributed.initialize_global_process_group_ray)
    distributed._hpc_rollout_original = original

    def gloo_only(timeout_second: Any = None, backend: Any = None) -> Any:
        return original(timeout_second=timeout_second, backend="gloo")

    distributed.initialize_global_process_group_ray = gloo_only
    engine_workers.initialize_global_process_group_ray = gloo_only

"""Template settings of the golden files (tests/slurm/golden/<case>.sbatch)."""

from __future__ import annotations

from typing import Any

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "worker_defaults": ("worker", {}),
    "worker_full": ("worker", {
        "run_dir": "/scratch/me/spool/run1", "nodes": "8", "array_parallelism": "4",
        "partition": "debug", "time": "04:00:00", "cpus_per_node": "8", "gpus_per_node": "2",
        "mem": "4G", "stages": "init,run", "run_pool": "16", "signal": "USR1",
        "signal_delay_s": "120", "python": "apptainer exec /images/rollout.sif python",
        "setup": ["module load cuda/12", "source /scratch/me/venv/bin/activate"],
    }),
    "eval_cpu": ("eval", {"run_dir": "spool/run1", "nodes": "4", "partition": "debug", "eval_pool": "32"}),
    "vllm": ("vllm", {
        "model": "/models/qwen", "gpus": "4", "run_dir": "/scratch/me/spool/run1",
        "extra_args": "--max-model-len 8192 --enable-prefix-caching",
    }),
    "sglang": ("vllm", {
        "model": "Qwen/Qwen2.5-0.5B-Instruct", "protocol": "sglang", "gpus": "1", "port": "30000",
        "served_model_name": "policy", "partition": "high", "time": "2-00:00",
    }),
}

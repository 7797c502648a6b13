"""TRL's GRPOTrainer learns on CPU through the spool: a tiny random model learns to answer with the digit it is told.

    python examples/trl_tiny.py                           # until the 10-step mean reward reaches 0.5
    python examples/trl_tiny.py --steps 60 --out /tmp/trl # shorter

As examples/grpo_tiny.py, with TRL's own trainer in place of the hand-written GRPO step:
    GRPOTrainer -> SpoolRollout (submit, local worker: serve-llm over HTTP, EVAL: the `answer`
    handler's reward) -> Parquet shard -> the entries TRL trains on -> TRL's update ->
    SwapWeightsCallback: serve-llm reloads the new weights -> next step samples the new policy.
Task: "say 7" is rewarded 1.0 when the reply starts with "7"; the model is the character-level
tiny model (orchestrator/devserver/tiny_model.py), random at the start. Needs `pip install
'hpc-rollout[trl]'`. Prints a reward line per step; writes OUT/rewards.jsonl and OUT/reward.png.
examples/trl_reasoning_gym.py runs the same loop (train_through_spool) on a reasoning-gym dataset.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))   # runs from a checkout without an install, too
sys.path.insert(0, str(REPO / "examples"))

from grpo_tiny import SETTINGS, report_run  # noqa: E402

from orchestrator.app.local_launch import start_local_workers  # noqa: E402
from orchestrator.devserver.local_server import start_server  # noqa: E402
from orchestrator.devserver.tiny_model import tiny_digits_model_dir  # noqa: E402
from orchestrator.llm.registry import BackendRegistry  # noqa: E402
from orchestrator.trainer.api import Spool  # noqa: E402
from orchestrator.worker.options import WorkerOptions  # noqa: E402


def digit_task(prompt: str) -> dict[str, Any]:
    return {"data_source": "toy/digits", "prompt": prompt, "match": "prefix",
            "reward_model": {"style": "rule", "ground_truth": prompt[-1]}}


def common_args(parser: argparse.ArgumentParser, out: str, steps: int, stop_at: float, lr: float = 2e-3,
                beta: float = 0.0) -> None:
    """The options every TRL example takes (examples/trl_reasoning_gym.py adds its own)."""
    parser.add_argument("--out", type=Path, default=REPO / "spool" / out, help="run directory (replaced)")
    parser.add_argument("--steps", type=int, default=steps, help="at most this many optimizer steps")
    parser.add_argument("--stop-at", type=float, default=stop_at, help="stop once the 10-step mean reward reaches this")
    parser.add_argument("--lr", type=float, default=lr, help="AdamW learning rate of the GRPO steps")
    parser.add_argument("--batch", type=int, default=32, help="samples per step (--generations per prompt)")
    parser.add_argument("--generations", type=int, default=8, help="samples per prompt (GRPO's group)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta", type=float, default=beta,
                        help="GRPOConfig's KL coefficient to the starting model (0: none, TRL's default)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(parser, "trl-tiny", steps=300, stop_at=0.5)
    return parser.parse_args()


def history_callback(history: list[dict], stop_at: float, started: float) -> Any:
    from transformers import TrainerCallback

    class RewardLog(TrainerCallback):  # one line per step, and the early stop
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **_: Any) -> None:
            if not logs or "reward" not in logs:
                return
            history.append({"step": state.global_step, "reward": float(logs["reward"]),
                            "loss": float(logs.get("loss", 0.0)), "t": time.monotonic() - started})
            mean10 = sum(h["reward"] for h in history[-10:]) / len(history[-10:])
            print(f"step {state.global_step:4d}  reward {history[-1]['reward']:5.3f}  mean10 {mean10:5.3f}  "
                  f"t {history[-1]['t']:6.1f}s", flush=True)
            if len(history) >= 10 and mean10 >= stop_at:
                control.should_training_stop = True

    return RewardLog()


def train_through_spool(args: argparse.Namespace, model: Path | Callable[[], Path], prompts: list[str],
                        task_of: Callable[[str], dict], started: float, max_completion_length: int,
                        source_handlers: dict[str, str] | None = None) -> list[dict]:
    """GRPOTrainer on `prompts` (cycled), every rollout a job of a fresh spool in args.out/spool run by a
    local worker against serve-llm serving `model` (a callable making it runs while the worker starts);
    returns one {step, reward, loss, t} per step."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from orchestrator.trainer.trl import SpoolRollout, SwapWeightsCallback, spool_reward

    spool = Spool.create(args.out / "spool", **SETTINGS)
    # The worker starts first: it imports while the server loads the model (no job comes before both).
    launch = start_local_workers(spool.paths, 1, WorkerOptions(runtime="local", idle_exit_s=0), verbose=0)
    server = None
    history: list[dict] = []
    try:
        model_dir = model() if callable(model) else model
        server = start_server(tiny=False, model_dir=model_dir, log_path=args.out / "serve-llm.log",
                              extra_args=["--max-batch", "64"])
        BackendRegistry(spool.paths).add(server.url, version=0)
        rollout = SpoolRollout(spool, task_of=task_of, source_handlers=source_handlers, time_limit_s=300)
        config = GRPOConfig(output_dir=str(args.out / "trainer"), use_cpu=True, max_steps=args.steps,
                            learning_rate=args.lr, per_device_train_batch_size=args.batch,
                            num_generations=args.generations, max_completion_length=max_completion_length,
                            temperature=1.0, logging_steps=1, report_to=[], save_strategy="no", bf16=False,
                            seed=args.seed, disable_tqdm=True, beta=args.beta)
        repeats = max(1, args.steps * args.batch // (args.generations * len(prompts)) + 1)
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[spool_reward], args=config,
                              train_dataset=Dataset.from_list([{"prompt": p} for p in prompts] * repeats),
                              rollout_func=rollout,
                              callbacks=[SwapWeightsCallback(spool, args.out / "ckpt"),
                                         history_callback(history, args.stop_at, started)])
        print(f"setup {time.monotonic() - started:.1f}s: model {model_dir}, server {server.url}, "
              f"run {spool.paths.root}", flush=True)
        trainer.train()
    finally:
        launch.terminate(timeout_s=30)
        if server is not None:
            server.stop()
    return history


def fresh_run(args: argparse.Namespace) -> float:
    """args.out emptied (a run directory is replaced); the run's start on the monotonic clock."""
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    return time.monotonic()


def main() -> int:
    args = parse_args()
    started = fresh_run(args)
    history = train_through_spool(args, tiny_digits_model_dir(), [f"say {d}" for d in range(10)], digit_task,
                                  started, max_completion_length=3, source_handlers={"toy/digits": "answer"})
    report_run(history, args.out, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())

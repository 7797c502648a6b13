"""verl 0.9.1's own `RayPPOTrainer.fit()` trains on the spool's rollouts: 2 steps, real GRPO updates;
and the same tests (parameter `v1`) on verl's v1 trainer, run by verl's own `TaskRunnerV1.run`
(TransferQueue, SpoolLoopManagerTQ; its two patches more: tests/verl/cpu_patches.py 7 and 8).

One fit() run (tests/verl/fit_run.py, in verl's venv), shared by every test here, driven as
main_ppo drives it: hydra over verl's ppo_trainer.yaml with the config of docs/trainer.md ("Train
with verl"), validate_config, create_rl_dataset (RLHFDataset) + collate_fn on a verl parquet of
math rows built here, the legacy trainer (`trainer.use_v1=false`), the rollout manager and the
checkpoint manager loaded by verl from the config, verl's real FSDP2 actor
(ActorRolloutRefWorker in a Ray worker of verl's RayWorkerGroup) updating the tiny model on CPU.

Real parts: two `serve-llm --tiny` servers registered in the spool (`backend add`), one worker
process in verl's venv (the custom reward function runs in its scorer sandbox: bubblewrap),
the SpoolCheckpointManager hook reloading both servers through swap_weights after every update.

What runs on CPU only because of patches, all in the test's processes (tests/verl/cpu_patches.py):
  1. a CPU platform registered in verl's platform registry (VERL_PLATFORM=cpu) and
     VERL_ENGINE_DEVICE=cuda, verl's override of the device that picks the FSDP engine;
  2. torch._C._cuda_setDevice: a no-op;
  3. attention sdpa and padding removal off (config: override_config.attn_implementation=sdpa,
     model.use_remove_padding=false);
  4. torch.cpu's missing memory statistics (memory_allocated, empty_cache, ...): zeros;
  5. the resource pool's GPU count: Ray's CPUs are counted;
  6. a gloo process group instead of "cpu:gloo,cuda:nccl".
and what `init_workers` does that needs a GPU is left out (fit_run.py): verl's vLLM rollout engine
inside the actor (role "actor") and verl's rollout servers (LLMServerManager): the spool's
registered backends serve instead (llm_client None, no replicas).

The same prompts come in both steps (rows 0-3 and 4-7 ask the same questions), so step 2 samples
the prompts of step 1 with the weights of step 1's update.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.report.status import pending_count
from orchestrator.spool.paths import SpoolPaths
from tests.core.util import cli, make_run, stop_worker
from tests.verl.env import VerlEnv, verl_env

pytestmark = [pytest.mark.llm, pytest.mark.bwrap]

PROMPTS, N, RESPONSE_LENGTH, PROMPT_LENGTH = 4, 4, 32, 128
LEARNING_RATE = 1e-2       # large enough that one update moves the sampled log-probs well past bf16 noise
# verl's own rollout_probs_diff_max (max |p_actor - p_rollout| over sampled tokens, the actor in
# bf16) when the servers hold the actor's weights: measured 1.3e-5 to 1.5e-5 (5 runs). Step 2's
# samples against the weights of step 0, i.e. had the update not reached the servers: 1.6e-4.
PROBS_DIFF_BOUND = 5e-5
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's custom_reward_function convention: a dict with `score` and extra info."""
    return {"score": (len(solution_str) % 5) / 4, "length": len(solution_str)}
'''
QUESTIONS = [("What is 12 + 30?", "42"), ("What is 7 * 6?", "42"), ("What is 100 - 58?", "42"), ("What is 84 / 2?", "42")]
MANAGER = "orchestrator.trainer.verl.SpoolLoopManager"
MANAGER_TQ = "orchestrator.trainer.verl.SpoolLoopManagerTQ"
TRAINERS = ("legacy", "v1")
HOOK = "orchestrator.trainer.verl.checkpoint_hook.SpoolCheckpointManager"


def verl_config(run: Path, parquet: Path, reward: Path, base: Path) -> list[str]:
    """The overrides of docs/trainer.md's legacy-trainer config, sized for the tiny model on CPU."""
    rollout, actor = "actor_rollout_ref.rollout", "actor_rollout_ref.actor"
    return [
        "algorithm.adv_estimator=grpo", "trainer.use_v1=false",
        f"data.train_files={parquet}", f"data.val_files={parquet}", f"data.train_batch_size={PROMPTS}",
        f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={RESPONSE_LENGTH}",
        "data.shuffle=false", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={tiny_model_dir()}",
        "actor_rollout_ref.model.use_remove_padding=false",                     # CPU patch 3
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",    # CPU patch 3
        f"{actor}.strategy=fsdp2", f"{actor}.ppo_mini_batch_size={PROMPTS}",
        f"{actor}.ppo_micro_batch_size_per_gpu={PROMPTS * N}", f"{actor}.optim.lr={LEARNING_RATE}",
        f"{rollout}.name=vllm", f"{rollout}.n={N}", f"{rollout}.calculate_log_probs=true",
        f"{rollout}.prompt_length={PROMPT_LENGTH}", f"{rollout}.response_length={RESPONSE_LENGTH}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={PROMPTS * N}",
        f"+{rollout}.agent.agent_loop_manager_class={MANAGER}",
        f"+{rollout}.checkpoint_manager_class={HOOK}",
        f"+{rollout}.checkpoint_engine.engine_kwargs.hpc_rollout.spool={run}",
        f"+hpc_rollout.spool={run}", "+hpc_rollout.handler=answer", "+hpc_rollout.time_limit_s=900",
        "+hpc_rollout.reward=custom",
        f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=compute_score",
        "trainer.total_epochs=1", "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.logger=[console,file]",
        f"trainer.default_local_dir={base / 'checkpoints'}", f"trainer.rollout_data_dir={base / 'generations'}",
    ]


def verl_config_v1(run: Path, parquet: Path, reward: Path, base: Path) -> list[str]:
    """docs/trainer.md's v1-trainer config: the legacy one with trainer.use_v1=true and the TransferQueue
    manager (the v1 trainer reads no checkpoint_manager_class), sized for this machine."""
    legacy = [o for o in verl_config(run, parquet, reward, base) if "checkpoint_manager_class" not in o]
    return [o.replace("trainer.use_v1=false", "trainer.use_v1=true").replace(f"={MANAGER}", f"={MANAGER_TQ}")
            for o in legacy] + [
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",   # one Ray CPU each; 2 cores here
        "actor_rollout_ref.rollout.nnodes=1",   # CPU patch 7: verl's LLMServerManager without hybrid replicas
    ]


@dataclass
class Fit:
    """What one fit() run left: verl's metrics and dumps, the spool's rows, the hook's record."""

    metrics: dict[int, dict[str, Any]]                 # verl's file logger, by global step
    generations: dict[int, list[dict[str, Any]]]       # verl's rollout_data_dir dump, by step
    rows_by_step: list[list[dict[str, Any]]]           # the spool's rows, by submission (= step)
    registry: dict[str, Any]
    driver: dict[str, Any]
    servers: list[str]
    left_running: list[str] = field(default_factory=list)
    seconds: float = 0.0
    trainer: str = "legacy"


@pytest.fixture(scope="module")
def verl(tmp_path_factory: pytest.TempPathFactory) -> VerlEnv:
    return verl_env(tmp_path_factory.mktemp("verl-env"))


@pytest.fixture(scope="module")
def two_servers() -> Iterator[list[LocalServer]]:
    first = start_server(threads=1, extra_args=("--logprobs-mode", "processed"))
    try:
        second = start_server(threads=1, extra_args=("--logprobs-mode", "processed"))
        try:
            yield [first, second]
        finally:
            second.stop()
    finally:
        first.stop()


@pytest.fixture(scope="module", params=TRAINERS)
def fit(request: pytest.FixtureRequest, verl: VerlEnv, two_servers: list[LocalServer],
        tmp_path_factory: pytest.TempPathFactory) -> Fit:
    base = tmp_path_factory.mktemp(f"verl-fit-{request.param}")
    config = verl_config_v1 if request.param == "v1" else verl_config
    reward = base / "reward.py"
    reward.write_text(REWARD)
    run = make_run(base / "run", **{"shards.max_age_s": 0.3, "shards.idle_flush_s": 0.05,
                                    "rewards.verl_custom_path": str(reward)})
    for server in two_servers:
        cli("backend", "add", str(run.root), server.url)
    parquet = base / "math.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{q} Answer with #### N."}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": a},
         "extra_info": {"split": "train", "index": i}} for i, (q, a) in enumerate(QUESTIONS + QUESTIONS)]), parquet)
    arguments = base / "fit.json"
    arguments.write_text(json.dumps({"overrides": config(run.root, parquet, reward, base),
                                     "metrics": str(base / "metrics.jsonl"), "run": str(run.root)}))
    worker = verl.popen("-m", "orchestrator.worker", str(run.root), "-v", log=run.root / "worker.log")
    started = time.monotonic()
    try:
        driver = run_driver(verl, arguments, base / "fit.log")
    finally:
        stop_worker(worker)
    return Fit(metrics={int(m["step"]): m["data"] for m in map(json.loads, (base / "metrics.jsonl").open())},
               generations={int(p.stem): [json.loads(line) for line in p.open()]
                            for p in (base / "generations").glob("*.jsonl")},
               rows_by_step=rows_by_submission(run), registry=json.loads(run.backends.read_text()),
               driver=driver, servers=[s.url for s in two_servers], left_running=left_running(run),
               seconds=time.monotonic() - started, trainer=request.param)


def run_driver(verl: VerlEnv, arguments: Path, log: Path) -> dict[str, Any]:
    """fit_run.py in its own process group: Ray and everything it started must be gone after it."""
    process = verl.popen("-m", "tests.verl.fit_run", str(arguments), log=log)
    try:
        code = process.wait(timeout=900)
    finally:
        leftovers = group_alive(process.pid)
        if process.poll() is None or leftovers:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log.read_text(errors="replace")
    assert code == 0, f"verl's fit() failed (exit {code}):\n{text[-6000:]}"
    assert not leftovers, f"processes of the fit run left running: Ray or a worker was not stopped\n{text[-2000:]}"
    return json.loads(text.strip().splitlines()[-1])


def group_alive(group: int, grace_s: float = 10.0) -> bool:
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.2)
    return True


def rows_by_submission(run: SpoolPaths) -> list[list[dict[str, Any]]]:
    """The rows of each training step: its submission's groups have rollout.n samples (not the
    manager's warm-up in create(), whose rows of 2 tokens are read and dropped before step 1)."""
    rows = [r for r in ds.dataset(run.shards, format="parquet").to_table().to_pylist() if r["group_size"] == N]
    submissions = sorted({r["group_id"].rsplit("-", 1)[0] for r in rows})
    return [sorted((r for r in rows if r["group_id"].startswith(s)), key=lambda r: r["job_id"]) for s in submissions]


def left_running(run: SpoolPaths) -> list[str]:
    held = [p.name for p in run.root.joinpath("active").glob("*/*") if not p.name.startswith(".")]
    return held + ([f"{pending_count(run)} pending"] if pending_count(run) else [])


def initial_log_probs(row: dict[str, Any]) -> np.ndarray:
    """log p(response token) under the tiny model as built (the weights of step 0), temperature 1."""
    import torch

    model = _initial_model()
    prompt, response = list(row["prompt_ids"]), list(row["response_ids"])
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1).numpy()


_MODEL: list[Any] = []


def _initial_model() -> Any:
    if not _MODEL:
        from transformers import AutoModelForCausalLM

        _MODEL.append(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir()), local_files_only=True).eval())
    return _MODEL[0]


def test_verls_fit_completes_two_steps_of_real_grpo_updates(fit: Fit) -> None:
    assert sorted(fit.metrics) == [1, 2], fit.metrics.keys()
    for step, m in fit.metrics.items():
        assert m["training/global_step"] == step
        assert math.isfinite(float(m["actor/pg_loss"])) and 0 < float(m["actor/grad_norm"]) < 1e3, m
        assert m["critic/score/max"] > m["critic/score/min"], "no reward variance: GRPO would not move"
        assert m["num_turns/min"] == m["num_turns/max"] == 2                   # __num_turns__ of our batch
        assert m["response_length/max"] <= RESPONSE_LENGTH
        if fit.trainer == "legacy":   # the v1 trainer takes no meta_info from its manager
            assert "timing_s/agent_loop/generate_sequences/mean" in m           # our meta_info["timing"]
    assert [len(rows) for rows in fit.rows_by_step] == [PROMPTS * N] * 2
    assert all(r["status"] == "ok" for rows in fit.rows_by_step for r in rows)
    assert {r["logprob_mode"] for rows in fit.rows_by_step for r in rows} == {"processed"}   # what verl expects
    assert fit.left_running == []                                             # no claim held, no job queued


def test_every_update_reaches_both_backends_before_the_next_step_samples(fit: Fit) -> None:
    """The hook (verl's checkpoint_manager_class) reloads every registered backend: step 0's weights
    before step 1, each update after it; rows carry the version that sampled them."""
    assert [p["step"] for p in fit.driver["pushed"]] == [0, 1, 2]
    for push in fit.driver["pushed"]:
        assert sorted(push["backends"]) == sorted(fit.servers) and push["removed"] == []
    assert fit.registry["policy_version"] == 2
    assert [b["policy_version"] for b in fit.registry["backends"]] == [2, 2]
    for version, rows in enumerate(fit.rows_by_step):
        assert {r["policy_version_min"] for r in rows} == {r["policy_version_max"] for r in rows} == {version}
    backends = {turn["backend"] for r in fit.rows_by_step[1] for turn in r["turns"]}
    assert backends == set(fit.servers), "step 2 should have sampled from both backends"


def test_step_2_samples_come_from_the_updated_weights(fit: Fit) -> None:
    """Step 1's samples are the initial model's log-probs exactly; step 2's, for the same prompts,
    are not: the servers sampled with the weights of the update (verl's own diff says the actor agrees)."""
    first = [np.abs(initial_log_probs(r) - np.asarray(r["logprobs"])).max() for r in fit.rows_by_step[0]]
    second = [np.abs(initial_log_probs(r) - np.asarray(r["logprobs"])).max() for r in fit.rows_by_step[1]]
    assert max(first) < 1e-4, first          # measured 9.5e-7
    assert min(second) > 0.05, second        # measured 0.27 to 0.67
    assert {tuple(r["prompt_ids"]) for r in fit.rows_by_step[0]} == {tuple(r["prompt_ids"]) for r in fit.rows_by_step[1]}


def test_verls_rollout_probs_diff_stays_within_the_bound(fit: Fit) -> None:
    for step, m in fit.metrics.items():
        assert m["training/rollout_probs_diff_valid"] == 1
        assert m["training/rollout_probs_diff_max"] <= PROBS_DIFF_BOUND, (step, m["training/rollout_probs_diff_max"])


def test_grpo_advantages_are_verls_compute_grpo_outcome_advantage_of_the_rows(fit: Fit) -> None:
    """What fit() computed from the manager's batch (its advantage metrics) is verl's GRPO of the
    spool's rows grouped by their group (= verl's uid), and GRPO by hand agrees."""
    assert len(fit.driver["grpo"]) == len(fit.rows_by_step) == 2
    for step, (verl_figures, rows) in enumerate(zip(fit.driver["grpo"], fit.rows_by_step), 1):
        m = fit.metrics[step]
        for key in ("mean", "max", "min"):
            assert m[f"critic/advantages/{key}"] == pytest.approx(verl_figures[key], abs=1e-5), (step, key)
        by_hand = []
        for group in sorted({r["group_id"] for r in rows}):
            scores = np.array([r["reward"] for r in rows if r["group_id"] == group])
            by_hand += list((scores - scores.mean()) / (scores.std(ddof=1) + 1e-6))
        assert max(by_hand) == pytest.approx(m["critic/advantages/max"], abs=1e-5)
        assert min(by_hand) == pytest.approx(m["critic/advantages/min"], abs=1e-5)


def test_the_custom_reward_of_each_text_is_what_verl_trained_on(fit: Fit) -> None:
    """verl's own dump of each step (rollout_data_dir): the score of every decoded response is the
    custom function's, and (legacy trainer) its extra info reached verl's reward_extra_info: the v1
    trainer's dump has no reward extras whatever the manager (verl 0.9.1, trainer_base._log_rollout_data)."""
    assert sorted(fit.generations) == [1, 2]
    for step, entries in fit.generations.items():
        assert len(entries) == PROMPTS * N
        for entry in entries:
            assert entry["score"] == pytest.approx((len(entry["output"]) % 5) / 4, abs=1e-6), entry
            if fit.trainer == "legacy":
                assert entry["length"] == len(entry["output"])

"""No reward function runs the model's output on the host: verl's code and math scorers and the
operator's custom function run in a scorer sandbox of their own (orchestrator/grading/scorer_sandbox.py).

Real parts: bubblewrap sandboxes; verl 0.9.1 in its own venv (scripts/verl-setup.sh) where the
worker that runs verl's default_compute_score lives; serve-llm --tiny with scripted replies, so
the reply is exactly the attack. Every check of the host is made from outside the sandbox, by
this test process, after the rows are committed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpc_rollout.handlers.answer import AnswerHandler
from orchestrator.config import Rewards, RunConfig
from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.events import events_named
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths, current_node
from orchestrator.submission.submit import submit_rows
from tests.agents.conftest import needs_bwrap
from tests.agents.helpers import rows
from tests.core.util import cli, make_run, stop_worker, write_jsonl
from tests.verl.env import VerlEnv, verl_env

DOUBLE = {"inputs": ["2\n", "21\n"], "outputs": ["4\n", "42\n"]}


def program(body: str) -> str:
    return f"Here is my solution.\n```python\n{body}\n```"


def host_write(path: Path) -> str:
    """Python that writes `path` (making its directory: inside a sandbox that succeeds too, in the
    sandbox's own /tmp) and carries on whatever happens, so a correct answer still scores."""
    return (f"import os\ntry:\n    os.makedirs({str(path.parent)!r}, exist_ok=True)\n"
            f"    open({str(path)!r}, 'w').write('written by the model')\nexcept OSError:\n    pass\n")


def code_row(match: str, source: str) -> dict[str, Any]:
    return {"instance_id": match, "data_source": source, "prompt": [{"role": "user", "content": f"{match}: read n, print 2n."}],
            "reward_model": {"style": "rule", "ground_truth": json.dumps(DOUBLE)}, "verl_reward": {"source": "default"}}


@pytest.fixture(scope="module")
def verl(tmp_path_factory: pytest.TempPathFactory) -> VerlEnv:
    return verl_env(tmp_path_factory.mktemp("verl-env"))


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # no spaces or underscores in the paths: prime_math's normalisation changes them before it calls eval()
    base = tmp_path_factory.mktemp("host")
    return {name: base / f"{name}.marker" for name in ("program", "matrix", "circle")}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory, markers: dict[str, Path]) -> Iterator[LocalServer]:
    scripts = [
        {"match": "attack", "replies": [program(host_write(markers["program"]) + "print(2 * int(input()))")]},
        {"match": "correct", "replies": [program("n = int(input())\nprint(n + n)")]},
        {"match": "wrong", "replies": [program("print(int(input()) + 1)")]},
        # prime_math (numina_*) hands a boxed list to eval() when the truth is a matrix, and any
        # answer containing \pi to eval() after replacing it
        {"match": "matrix", "replies": [f"\\boxed{{[open('{markers['matrix']}','w').write('x')]}}"]},
        {"match": "circle", "replies": [f"\\boxed{{\\pi+open('{markers['circle']}','w').write('x')}}"]},
        {"match": "", "replies": ["I do not know."]},
    ]
    path = tmp_path_factory.mktemp("scripts") / "scripts.json"
    path.write_text(json.dumps(scripts))
    server = start_server(threads=1, extra_args=("--scripted", str(path)))
    try:
        yield server
    finally:
        server.stop()


def run_in_verl_worker(verl: VerlEnv, paths: SpoolPaths, expected: int, timeout_s: float = 600) -> list[dict[str, Any]]:
    """One real worker in verl's venv until `expected` rows are committed."""
    worker = verl.popen("-m", "orchestrator.worker", str(paths.root), "-v", log=paths.root / "worker.log")
    try:
        deadline = time.monotonic() + timeout_s
        while len(found := rows(paths)) < expected:
            assert worker.poll() is None, (paths.root / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{len(found)} of {expected} rows after {timeout_s} s"
            time.sleep(0.5)
        return found
    finally:
        stop_worker(worker)


@needs_bwrap
@pytest.mark.llm
def test_verls_code_and_math_scorers_run_the_reply_in_a_sandbox_not_on_the_host(
        tmp_path: Path, verl: VerlEnv, scripted: LocalServer, markers: dict[str, Path]) -> None:
    paths = make_run(tmp_path / "run", **{"sandbox.runtime": "bwrap"})
    BackendRegistry.of(paths).add(scripted.url, protocol="vllm", version=0)
    matrix, circle = ("matrix", "\\begin{pmatrix}1\\end{pmatrix}"), ("circle", "3")
    math_rows = [{"instance_id": word, "data_source": "numina_olympiads", "prompt": [{"role": "user", "content": f"{word}?"}],
                  "reward_model": {"ground_truth": truth}, "verl_reward": {"source": "default"}}
                 for word, truth in (matrix, circle)]
    tasks = [code_row("attack", "codecontests"), code_row("correct", "apps"), code_row("wrong", "taco"), *math_rows]
    report = submit_rows(paths, enumerate(tasks, 1), handler="answer", sampling={"max_tokens": 200})
    assert report.jobs == len(tasks), report.rejected
    found = {row["instance_id"]: row for row in run_in_verl_worker(verl, paths, len(tasks))}
    written = {name: path.read_text() for name, path in markers.items() if path.exists()}
    rewards = {row["instance_id"]: row["reward"] for row in found.values()}
    assert written == {}, f"the model's output ran on the host: {written}; rewards {rewards}"
    assert all(row["status"] == "ok" for row in found.values()), [(r["status"], r["error"]) for r in found.values()]
    # prime_code really scores in its sandbox: the attack still answers right, the wrong program does not;
    # prime_math's eval() of the boxed answers fails there (no such directory), so they score 0
    assert rewards == {"attack": 1.0, "correct": 1.0, "wrong": 0.0, "matrix": 0.0, "circle": 0.0}, rewards
    sandboxed = {event["job"]: event for event in events_named(paths, "scorer_sandboxed")}
    assert set(sandboxed) == {row["job_id"] for row in found.values()}, sandboxed   # each EVAL went through one
    print("scorer sandbox ms:", {found_id: sandboxed[row["job_id"]]["ms"] for found_id, row in found.items()})


@needs_bwrap
def test_the_operators_reward_function_runs_sandboxed_and_cannot_write_the_host(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"sandbox.runtime": "bwrap"})
    marker, in_prefix = tmp_path / "custom.marker", Path(sys.prefix) / "hpc-rollout-scorer-was-here"
    reward = tmp_path / "reward.py"
    reward.write_text(f'''
import errno
from pathlib import Path
attempts = {{}}
for name, target in (("host_file", {str(marker)!r}), ("python_prefix", {str(in_prefix)!r})):
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text("written by the reward function")
        attempts[name] = "written"
    except OSError as exc:
        attempts[name] = errno.errorcode.get(exc.errno, str(exc))

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return {{"score": float(ground_truth in solution_str) + bonus, **attempts}}
''')
    rewards = Rewards(verl_custom_path=str(reward), verl_custom_name="compute_score")
    instance = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2+2?"}],
                "reward_model": {"ground_truth": "4"}, "verl_reward": {"source": "custom", "reward_kwargs": {"bonus": 0.5}}}
    try:
        scored = evaluate(paths, instance, rewards, "it is 4", runtime="bwrap")
    finally:
        written = {p.name for p in (marker, in_prefix) if p.exists()}
        in_prefix.unlink(missing_ok=True)
    assert written == set(), f"the reward function wrote {written} on the host"
    assert scored["reward"] == 1.5, scored   # it ran, with the row's reward_kwargs
    # it wrote its file, in the sandbox's own /tmp (gone with it); the Python installation is read-only there
    assert scored["reward_extra_info"] == {"score": 1.5, "host_file": "written", "python_prefix": "EROFS"}, scored


def evaluate(paths: SpoolPaths, instance: dict[str, Any], rewards: Rewards, reply: str, runtime: str) -> dict[str, Any]:
    """`answer`'s EVAL of one job, in a JobContext as a worker of `paths` builds it."""
    config = RunConfig.load(paths.run_config)
    job = JobSpec(job_id="s-0000000-0000", group_id="s-0000000", instance_id="i", sample_index=0,
                  handler="answer", instance=instance)
    services = WorkerServices(paths=paths, worker_id="w", node=current_node(), runtime=runtime,
                              sandbox_defaults=config.sandbox.defaults(), rewards=rewards)
    ctx = JobContext(job=job, stage=Stage.EVAL, attempt=1, services=services)
    return asyncio.run(AnswerHandler().eval(ctx, {"reply": reply}))


def test_reward_kwargs_that_clash_with_the_scorers_arguments_are_refused_at_submit(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    base = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2+2?"}],
            "reward_model": {"ground_truth": "4"}}
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [
        {**base, "verl_reward": {"source": "default"}},                                              # fine
        {**base, "verl_reward": {"source": "custom", "reward_kwargs": {"solution_str": "4"}}},
        {**base, "verl_reward": {"source": "custom", "reward_kwargs": {"ground_truth": "5", "extra_info": {}}}},
        {**base, "verl_reward": {"source": "default", "reward_kwargs": {"data_source": "codecontests"}}},
        {**base, "verl_reward": {"source": "default", "reward_kwargs": {"sandbox_fusion_url": "http://10.0.0.1:8080"}}},
        {**base, "verl_reward": {"source": "custom", "reward_kwargs": {"scale": 2}}},                 # fine
    ])
    done = cli("submit", str(paths.root), str(tasks), "--handler", "answer", check=False)
    output = done.stdout + done.stderr
    for line, words in ((2, "solution_str"), (3, "extra_info, ground_truth"), (4, "data_source")):
        assert f"{tasks}:{line}: " in output and words in output, output
    assert "clash with the arguments the scorer is always called with" in output, output
    assert f"{tasks}:5: " in output and "sandbox_fusion_url" in output, output
    assert f"{tasks}:1: " not in output and f"{tasks}:6: " not in output, output
    assert "2 task(s)" in output, output


def test_code_executing_scorers_are_refused_with_the_local_runtime(tmp_path: Path) -> None:
    """`local` has no sandbox: refused at submit (when run.toml says so) and again at EVAL, before any import."""
    paths = make_run(tmp_path / "run", **{"sandbox.runtime": "local"})
    reward = tmp_path / "reward.py"
    marker = tmp_path / "imported.marker"
    reward.write_text(f"open({str(marker)!r}, 'w').write('imported')\ndef compute_score(**kwargs):\n    return 1.0\n")
    rewards = Rewards(verl_custom_path=str(reward))
    code = code_row("attack", "codecontests")
    custom = {**code, "data_source": "openai/gsm8k", "verl_reward": {"source": "custom"}}
    for instance in (code, custom):
        with pytest.raises(ValueError, match=r"`local` runtime, which has no sandbox: .*runtime = \"auto\" or \"bwrap\""):
            evaluate(paths, instance, rewards, program("print(2 * int(input()))"), runtime="local")
    assert not marker.exists()
    from orchestrator.grading.verl_reward import refuse_unsandboxed   # what submit asks (run.toml's runtime)

    for instance in (code, custom):
        with pytest.raises(ValueError, match=r"`local` runtime, which has no sandbox: run them with bubblewrap"):
            refuse_unsandboxed(instance, "local")
    refuse_unsandboxed(code, "bwrap")                                      # a sandbox runtime: fine
    refuse_unsandboxed({**code, "data_source": "openai/gsm8k"}, "local")   # a string scorer: fine anywhere


def test_a_code_executing_scorer_is_refused_at_submit_when_the_run_has_no_sandbox(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"sandbox.runtime": "local"})
    code = code_row("attack", "codecontests")
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [code, {**code, "data_source": "openai/gsm8k"},
                                                   {**code, "verl_reward": {"source": "custom"}}])
    done = cli("submit", str(paths.root), str(tasks), "--handler", "answer", check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"{tasks}:1: " in output and f"{tasks}:3: " in output and f"{tasks}:2: " not in output, output
    assert "`local` runtime, which has no sandbox: run them with bubblewrap" in output, output
    assert "1 task(s)" in output, output


def test_a_verl_config_whose_reward_kwargs_clash_is_refused_before_any_job(tmp_path: Path) -> None:
    from orchestrator.trainer.verl.settings import VerlConfigError, parse_settings

    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
                      "    return scale\n")
    config: dict[str, Any] = {"actor_rollout_ref": {"rollout": {"n": 2}, "model": {"path": "/models/tiny"}},
                              "hpc_rollout": {"spool": str(tmp_path / "run"), "reward": "custom"},
                              "reward": {"custom_reward_function": {"path": str(reward), "reward_kwargs": {"scale": 2}}}}
    assert parse_settings(config).reward_spec() == {"source": "custom", "reward_kwargs": {"scale": 2}}
    config["reward"]["custom_reward_function"]["reward_kwargs"] = {"scale": 2, "solution_str": "x"}
    with pytest.raises(VerlConfigError, match=r"reward.custom_reward_function.reward_kwargs solution_str clash with "
                                              r"the arguments the scorer is always called with"):
        parse_settings(config)


def test_a_python_installation_that_would_show_the_home_or_run_directory_is_not_bound(tmp_path: Path) -> None:
    from orchestrator.grading.scorer_sandbox import ScorerSandboxError, python_roots

    bound = python_roots((), private=(tmp_path,))
    assert bound and all(not tmp_path.is_relative_to(source) for source, _ in bound), bound
    inside_the_prefix = Path(sys.base_prefix) / "home" / "someone"   # e.g. pip install --prefix ~
    with pytest.raises(ScorerSandboxError, match=r"holds .*someone: binding it into the scorer sandbox would show that"):
        python_roots((), private=(inside_the_prefix,))


def test_the_scorer_sandbox_on_apptainer_has_no_network_and_only_read_only_host_paths(tmp_path: Path) -> None:
    """Apptainer up to its command line (no binary here): the run's image, the worker's Python read-only,
    the network off, the only writable host path the call's own workspace in the job's directory."""
    from orchestrator.grading.scorer_sandbox import python_roots, sandbox_options
    from orchestrator.sandbox import apptainer
    from orchestrator.sandbox.options import SandboxOptions
    from orchestrator.sandbox.spec import LaunchSpec

    image = tmp_path / "run.sif"
    image.write_text("sif")
    paths = make_run(tmp_path / "run", **{"sandbox.image": str(image), "sandbox.runtime": "apptainer"})
    services = WorkerServices(paths=paths, worker_id="w", node=current_node(), runtime="apptainer",
                              sandbox_defaults=RunConfig.load(paths.run_config).sandbox.defaults())
    job = JobSpec(job_id="s-0000000-0000", group_id="s-0000000", instance_id="i", sample_index=0, handler="answer",
                  instance={})
    roots = python_roots((), private=(paths.root,))
    workspace = paths.job_dir(job.job_id) / "scorer-1-abcdef"
    options = SandboxOptions.parse(**sandbox_options(JobContext(job, Stage.EVAL, 1, services), "apptainer", roots, workspace))
    argv = apptainer.build_argv(LaunchSpec(sandbox_id="abc123", job_id=job.job_id, runtime_dir=tmp_path / "rt",
                                           socket_dir=tmp_path / "rt" / "s", workspace=workspace, options=options,
                                           loopback="127.9.9.9"), binary="apptainer")
    assert argv[argv.index("--net"):argv.index("--net") + 3] == ["--net", "--network", "none"], argv
    binds = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--bind"]
    writable = [bind for bind in binds if bind.endswith(":rw")]
    assert writable == [f"{workspace}:/workspace:rw", f"{tmp_path}/rt/s:/.hpc-rollout/run:rw"], binds
    assert {f"{source}:{target}:ro" for source, target in roots} <= set(binds), binds
    assert str(image) in argv and "--fakeroot" not in argv

"""Bad input gets one line naming the problem and the fix: no traceback, nothing accepted silently."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.llm.registry import BackendRegistry
from orchestrator.report.status import pending_count
from tests.core.util import cli, make_run, write_jsonl
from tests.faults.helpers import fill_disk, small_tmpfs


def cli_env(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle.lower() in lines[0].lower(), lines[0]


# -- item 14: tracebacks instead of one-line errors --------------------------------------------

def test_serve_llm_on_a_busy_port_says_so_before_loading_anything() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        one_line_error(cli("serve-llm", "--tiny", "--port", str(port), check=False), f"port {port}", "--port")


def test_serve_llm_and_demo_without_torch_say_how_to_install_it(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named torch (shadowed by the test)')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", "")])}
    one_line_error(cli_env("serve-llm", "--tiny", "--port", "0", env=env), "torch", "pip install")
    one_line_error(cli_env("demo", "--dir", str(tmp_path / "demo"), env=env), "torch", "pip install")


def test_serve_llm_with_a_model_directory_without_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    one_line_error(cli("serve-llm", "--model", str(tmp_path / "model"), "--port", "0", check=False),
                   "tokenizer", str(tmp_path / "model"))


def test_apptainer_runtime_without_apptainer(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    if any(Path(d, name).exists() for d in ("/usr/bin", "/bin") for name in ("apptainer", "singularity")):
        pytest.skip("Apptainer is installed here")
    one_line_error(cli_env("sandbox", "exec", "--runtime", "apptainer", "--", "true", env=env), "apptainer", "bwrap")
    paths = make_run(tmp_path / "run")
    one_line_error(cli_env("launch", str(paths.root), "--local", "--runtime", "apptainer", env=env),
                   "apptainer", "bwrap")


def test_image_build_without_mmdebstrap(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    one_line_error(cli_env("image", "build", "python", "--format", "dir", "--out", str(tmp_path / "out"),
                           env={"PATH": str(bare)}), "mmdebstrap")


def test_a_run_toml_that_is_not_utf8(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    paths.run_config.write_bytes(b"[pools]\nrun = 4 # \xff\xfe caf\xe9\n")
    one_line_error(cli("status", str(paths.root), check=False), "run.toml", "UTF-8")


def test_launch_on_a_full_disk(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", 2) as disk:
        paths = make_run(disk / "run")
        fill_disk(disk)
        one_line_error(cli("launch", str(paths.root), "--local", check=False), "no space left", "free")


# -- item 15: silent acceptance ------------------------------------------------------------

def test_a_misspelt_sampling_parameter_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])
    one_line_error(cli("submit", str(paths.root), str(tasks), "--sampling", "tempreature=0.7", check=False),
                   "tempreature", "did you mean 'temperature'")
    assert pending_count(paths) == 0
    cli("submit", str(paths.root), str(tasks), "--sampling", "temperature=0.7", "--sampling", "min_p=0.05")
    cli("submit", str(paths.root), str(tasks), "--sampling", "my_server_knob=1", "--sampling-unchecked")
    assert pending_count(paths) == 2


def test_cancel_refuses_unknown_jobs_and_all_as_a_job_id(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    submitted = cli("submit", str(paths.root), str(write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])))
    job = next(word for word in submitted.stdout.split() if word.endswith("-0000"))
    one_line_error(cli("cancel", str(paths.root), "20990101T000000000-dead-0000000-0000", check=False), "no job", "status")
    one_line_error(cli("cancel", str(paths.root), "ALL", check=False), "--all")
    one_line_error(cli("cancel", str(paths.root), "--group", "nope", check=False), "no group")
    assert not (paths.cancel / "ALL").exists()
    cli("cancel", str(paths.root), job)
    assert (paths.cancel / job).exists()


def test_tail_refuses_unknown_fields_and_bad_cursors(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    one_line_error(cli("tail", str(paths.root), "--fields", "job_id,rewrd", check=False), "rewrd", "did you mean 'reward'")
    one_line_error(cli("tail", str(paths.root), "--since", "bogus", check=False), "bogus", "cursor")


def test_backend_add_says_when_the_url_does_not_answer_and_check_refuses(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"  # nothing listens once closed
    added = cli("backend", "add", str(paths.root), url)
    assert "does not answer" in added.stderr and "Traceback" not in added.stderr
    one_line_error(cli("backend", "add", str(paths.root), url.replace("/v1", "/v2"), "--check", check=False),
                   "does not answer", "--check")
    assert [b.url for b in BackendRegistry.of(paths).read().backends] == [url]


def test_backend_commands_refuse_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "not-a-run").mkdir()
    one_line_error(cli("backend", "add", str(tmp_path / "not-a-run"), "http://node1:8000/v1", check=False),
                   "not a run directory", "hpc-rollout init")
    assert not (tmp_path / "not-a-run" / "backends.json").exists()

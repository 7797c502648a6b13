"""sbatch templates: golden files, quoting, validation, packaging (no cluster needed)."""

from __future__ import annotations

import importlib.resources
import os
import subprocess
from pathlib import Path

import jinja2.meta
import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.slurm.errors import TemplateError, UnknownSetting, UnknownTemplate
from orchestrator.slurm.templates import SUFFIX, ValueKind, environment, render, settings_of, template_names
from tests.slurm.cases import CASES

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_script_matches_golden_file(case: str) -> None:
    name, values = CASES[case]
    text = render(name, values)
    golden = GOLDEN / f"{case}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"regenerate with UPDATE_GOLDEN=1 pytest {__file__}"
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_optional_directives_appear_only_when_set() -> None:
    bare = render("worker")
    assert "--partition" not in bare and "--account" not in bare and "--gpus-per-node" not in bare
    full = render("worker", {"partition": "batch", "account": "proj", "qos": "high", "gpus_per_node": "2"})
    for line in ("#SBATCH --partition=batch", "#SBATCH --account=proj", "#SBATCH --qos=high",
                 "#SBATCH --gpus-per-node=2"):
        assert line in full.splitlines()


def test_values_are_quoted_so_nothing_reaches_the_shell(tmp_path: Path) -> None:
    evil = f"x; touch {tmp_path}/pwned $(touch {tmp_path}/pwned2) `id`"
    text = render("vllm", {"run_dir": evil, "model": evil})
    run_dir_line = next(line for line in text.splitlines() if line.startswith("RUN_DIR="))
    shown = subprocess.run(["bash", "-c", f'{run_dir_line}\nprintf %s "$RUN_DIR"'],
                           capture_output=True, text=True, check=True).stdout
    assert shown == evil
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


@pytest.mark.parametrize("key,value", [("partition", "debug\n#SBATCH --uid=0"), ("partition", "a b"),
                                       ("nodes", "two"), ("time", "forever"), ("exclusive", "maybe"),
                                       ("signal", "KILL"), ("setup", "echo hi\nrm -rf /")])
def test_invalid_values_are_refused_with_the_rule(key: str, value: str) -> None:
    with pytest.raises(TemplateError, match=key):
        render("worker", {key: value})


def test_unknown_setting_names_the_valid_ones() -> None:
    with pytest.raises(UnknownSetting) as info:
        render("worker", {"nodez": "2"})
    assert "nodez" in str(info.value) and "nodes" in info.value.valid and "partition" in info.value.valid


def test_unknown_template_names_the_valid_ones() -> None:
    with pytest.raises(UnknownTemplate, match="valid templates: eval, vllm, worker"):
        render("mpi")


def test_vllm_needs_a_model() -> None:
    with pytest.raises(TemplateError, match="--set model="):
        render("vllm")


def test_every_setting_is_used_by_its_template_and_nothing_else_is_read() -> None:
    env = environment()
    for name in template_names():
        source = env.loader.get_source(env, name + SUFFIX)[0]  # type: ignore[union-attr]
        used = set(jinja2.meta.find_undeclared_variables(env.parse(source)))
        for parent in jinja2.meta.find_referenced_templates(env.parse(source)):
            used |= jinja2.meta.find_undeclared_variables(env.parse(env.loader.get_source(env, parent)[0]))  # type: ignore[union-attr]
        declared = {s.name for s in settings_of(name)}
        if "worker_args" in used:   # the worker options, rendered together as the node task's arguments
            used = used - {"worker_args"} | {s.name for s in settings_of(name) if s.kind is ValueKind.WORKER}
        assert used <= declared, f"{name} reads undeclared {used - declared}"
        unused = declared - used
        assert not unused, f"{name} declares unused settings {unused}"


def test_templates_ship_as_package_data() -> None:
    files = {p.name for p in importlib.resources.files("hpc_rollout.sbatch").iterdir()}
    assert {f"{n}{SUFFIX}" for n in template_names()} <= files
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"hpc_rollout.sbatch" = ["*.j2"' in pyproject


def test_cli_render_prints_and_rejects_unknown_keys(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["sbatch", "render", "worker", "--set", "nodes=8", "--set", "partition=batch"])
    assert ok.exit_code == 0, ok.output
    assert "#SBATCH --array=0-7" in ok.output and "#SBATCH --partition=batch" in ok.output
    bad = runner.invoke(cli, ["sbatch", "render", "worker", "--set", "gpu=1"])
    assert bad.exit_code != 0 and "valid settings:" in bad.output and "gpus_per_node" in bad.output
    out = tmp_path / "vllm.sbatch"
    wrote = runner.invoke(cli, ["sbatch", "render", "vllm", "--set", "model=/m", "-o", str(out)])
    assert wrote.exit_code == 0 and out.read_text().startswith("#!/bin/bash")
    listed = runner.invoke(cli, ["sbatch", "list", "vllm"])
    assert "health_timeout_s" in listed.output

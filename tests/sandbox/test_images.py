"""Image templates (checked by spython's parser) and the cache-keyed builder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.images.builder import build_image
from orchestrator.sandbox.images.cache import BuildAction, BuildPlan, CacheKeys, Mode, plan_build
from orchestrator.sandbox.images.templates import (
    Rendered, available, find_template, header_fields, render, sections,
)

REPO = Path(__file__).resolve().parents[2]


def _spython(text: str, tmp_path: Path) -> object:
    path = tmp_path / "Singularity"
    path.write_text(text)
    return list(SingularityParser(str(path)).recipe.values())[0]


@pytest.mark.parametrize("template", ["python", "swe", "math"])
def test_templates_render_and_parse_with_spython(template: str, tmp_path: Path) -> None:
    assert set(available()) >= {"python", "swe", "math"}
    recipe = _spython(render(find_template(template), {"bootstrap": "docker"}).text, tmp_path)
    assert recipe.fromHeader.startswith("python:3.11")               # type: ignore[attr-defined]
    assert f"org.hpc-rollout.template {template}" in recipe.labels     # type: ignore[attr-defined]
    assert any("apt-get install" in line for line in recipe.install)  # type: ignore[attr-defined]
    assert "LANG=C.UTF-8" in recipe.environ                            # type: ignore[attr-defined]


@pytest.mark.parametrize("bootstrap,expected", [
    ("debootstrap", {"bootstrap": "debootstrap", "osversion": "bookworm",
                     "mirrorurl": "http://deb.debian.org/debian"}),
    ("localimage", {"bootstrap": "localimage", "from": "/images/base.sif"}),
])
def test_other_bootstraps_have_valid_headers(bootstrap: str, expected: dict[str, str], tmp_path: Path) -> None:
    text = render(find_template("swe"), {"bootstrap": bootstrap, "from_image": "/images/base.sif"}).text
    fields = header_fields(text)
    assert {k: fields[k] for k in expected} == expected
    # spython's parser only accepts Bootstrap: docker; the sections must still parse.
    body = text[text.index("%labels"):]
    recipe = _spython("Bootstrap: docker\nFrom: debian:bookworm\n\n" + body, tmp_path)
    assert recipe.install and recipe.labels                            # type: ignore[attr-defined]


def test_unknown_bootstrap_and_template_are_errors() -> None:
    with pytest.raises(SandboxConfigError, match="bootstrap must be docker, localimage or debootstrap"):
        render(find_template("python"), {"bootstrap": "yum"})
    with pytest.raises(SandboxConfigError, match="python, swe"):
        find_template("nonexistent")


def test_cache_keys_follow_their_inputs() -> None:
    base = {"bootstrap": "docker", "base_image": "python:3.11", "framework_version": "1"}
    keys = CacheKeys.compute("swe", base, "text", "numpy==1\n")
    assert keys.versioned == CacheKeys.compute("swe", base, "other text", "other lock").versioned
    assert keys.versioned != CacheKeys.compute("swe", {**base, "framework_version": "2"}, "text").versioned
    assert keys.versioned != CacheKeys.compute("swe", {**base, "base_image": "python:3.12"}, "text").versioned
    assert keys.lock == CacheKeys.compute("swe", {**base, "framework_version": "2"}, "x", "numpy==1\n").lock
    assert keys.lock != CacheKeys.compute("swe", base, "text", "numpy==2\n").lock


@pytest.mark.parametrize("mode,present,action,base", [
    (Mode.VERSIONED, {"versioned"}, BuildAction.REUSE, None),
    (Mode.VERSIONED, set(), BuildAction.SCRATCH, None),
    (Mode.LOCK, {"lock", "versioned"}, BuildAction.REUSE, None),
    (Mode.LOCK, {"versioned"}, BuildAction.FROM_VERSIONED, "versioned"),
    (Mode.LOCK, set(), BuildAction.SCRATCH, None),
    (Mode.SOURCE, {"source", "lock"}, BuildAction.REUSE, None),
    (Mode.SOURCE, {"lock", "versioned"}, BuildAction.FROM_LOCK, "lock"),
    (Mode.SOURCE, {"versioned"}, BuildAction.FROM_VERSIONED, "versioned"),
    (Mode.SOURCE, set(), BuildAction.SCRATCH, None),
    (Mode.SCRATCH, {"versioned", "lock", "source", "scratch"}, BuildAction.SCRATCH, None),
])
def test_plan_decides_reuse_layering_or_scratch(
    mode: Mode, present: set[str], action: BuildAction, base: str | None, tmp_path: Path
) -> None:
    keys = CacheKeys("swe", "v1", "l1", "s1", "x1")
    existing = {tmp_path / f"swe-{name}-{getattr(keys, name)}.sif" for name in present}
    plan = plan_build(mode, keys, tmp_path, ".sif", exists=lambda p: p in existing)
    assert plan.action is action
    assert plan.target == tmp_path / f"swe-{mode.value}-{getattr(keys, mode.value)}.sif"
    assert plan.base == (None if base is None else tmp_path / f"swe-{base}-{getattr(keys, base)}.sif")


def _fake_backend(log: Path):  # type: ignore[no-untyped-def]
    def build(rendered: Rendered, definition: Path, output: Path, plan: BuildPlan) -> None:
        with open(log, "a") as fh:
            fh.write(f"{plan.action.value} {definition.name}\n")
        output.write_text(rendered.text)
    return build


def test_builder_reuses_and_layers_lock_on_versioned(tmp_path: Path) -> None:
    out, log = tmp_path / "out", tmp_path / "builds.log"
    lock = tmp_path / "requirements.lock"
    lock.write_text("sympy==1.12\n")
    template = find_template("math")
    first = build_image(template, mode="versioned", fmt="sif", out_dir=out, backend=_fake_backend(log))
    again = build_image(template, mode="versioned", fmt="sif", out_dir=out, backend=_fake_backend(log))
    layered = build_image(template, mode="lock", lock_file=lock, fmt="sif", out_dir=out,
                          backend=_fake_backend(log))
    assert (first.built, again.built, layered.built) == (True, False, True)
    assert again.path == first.path and first.path.name.startswith("math-versioned-")
    assert layered.plan.action is BuildAction.FROM_VERSIONED
    text = layered.path.read_text()
    assert "Bootstrap: localimage" in text and f"From: {first.path}" in text
    assert "sympy==1.12" in text and "apt-get install" not in text   # only the layer's work
    assert len(log.read_text().splitlines()) == 2
    assert [p.name for p in out.iterdir() if p.name.startswith(".") and "tmp" in p.name] == []


def test_failed_build_leaves_no_image(tmp_path: Path) -> None:
    def broken(rendered: Rendered, definition: Path, output: Path, plan: BuildPlan) -> None:
        output.write_text("half")
        raise RuntimeError("network down")

    with pytest.raises(RuntimeError, match="network down"):
        build_image(find_template("python"), mode="versioned", fmt="sif", out_dir=tmp_path, backend=broken)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".def")) == []


CONCURRENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from orchestrator.sandbox.images.builder import build_image
    from orchestrator.sandbox.images.templates import find_template

    out, log = Path(sys.argv[1]), Path(sys.argv[2])

    def slow(rendered, definition, output, plan):
        with open(log, "a") as fh:
            fh.write("build\\n")
        time.sleep(1.0)
        output.write_text(rendered.text)

    outcome = build_image(find_template("swe"), mode="versioned", fmt="sif", out_dir=out, backend=slow)
    print("built" if outcome.built else "reused", outcome.path)
""")


def test_two_processes_build_one_image_once(tmp_path: Path) -> None:
    out, log = tmp_path / "out", tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(out), str(log)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ)) for _ in range(2)]
    answers = sorted(p.communicate()[0].split()[0] for p in procs)
    assert answers == ["built", "reused"]
    assert log.read_text() == "build\n"


def test_sif_without_apptainer_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxConfigError, match="--format dir"):
        build_image(find_template("python"), fmt="sif", out_dir=tmp_path / "out")


def test_sections_parser() -> None:
    text = render(find_template("python"), {}).text
    parts = sections(text)
    assert {"header", "labels", "help", "post", "environment", "runscript", "test"} <= set(parts)
    assert "mkdir -p /workspace" in parts["post"]


LAYER_TEMPLATE = """{% include "_header.def.j2" %}

%post
    echo "layer for {{ framework_version }}" > /layer.txt
"""


def _tiny_rootfs(root: Path) -> None:
    """A rootfs with just /bin/sh (dash and the C library): enough to run a %post."""
    import shutil

    libs = root / "usr" / "lib" / "x86_64-linux-gnu"
    libs.mkdir(parents=True)
    (root / "usr" / "bin").mkdir()
    (root / "usr" / "lib64").mkdir()
    shutil.copy2("/usr/bin/dash", root / "usr" / "bin" / "sh")
    shutil.copy2("/lib/x86_64-linux-gnu/libc.so.6", libs / "libc.so.6")
    shutil.copy2("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", libs / "ld-linux-x86-64.so.2")
    (root / "usr" / "lib64" / "ld-linux-x86-64.so.2").symlink_to("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    for name in ("bin", "lib", "lib64"):
        (root / name).symlink_to(f"usr/{name}")
    (root / "etc").mkdir()


@pytest.mark.skipif(not Path("/lib/x86_64-linux-gnu/libc.so.6").exists() or not Path("/usr/bin/dash").exists(),
                    reason="needs an x86_64 Debian-like host to assemble a tiny rootfs")
def test_dir_image_layer_runs_post_in_a_copy_of_the_base(tmp_path: Path) -> None:
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    template = tmp_path / "tiny.def.j2"
    template.write_text(LAYER_TEMPLATE)
    lock = tmp_path / "req.lock"
    lock.write_text("nothing==0\n")
    out = tmp_path / "out"
    out.mkdir()
    variables = {"framework_version": "7"}
    full = render(template, {**variables, "lock_text": "nothing==0\n"})
    keys = CacheKeys.compute(full.name, full.variables, full.text, "nothing==0\n")
    base = out / keys.name(Mode.VERSIONED)
    _tiny_rootfs(base)            # stands in for a versioned image built earlier
    outcome = build_image(template, mode="lock", variables=variables, fmt="dir", out_dir=out, lock_file=lock)
    assert outcome.built and outcome.plan.action is BuildAction.FROM_VERSIONED
    assert (outcome.path / "layer.txt").read_text() == "layer for 7\n"
    assert (outcome.path / "workspace").is_dir() and (outcome.path / "usr" / "bin" / "sh").exists()
    assert not (base / "layer.txt").exists()                      # the base is untouched


SETUP_LAYER = """{% include "_header.def.j2" %}

%setup
    echo "fetched on the host" > "$APPTAINER_ROOTFS/fetched.txt"
    [ "$SINGULARITY_ROOTFS" = "$APPTAINER_ROOTFS" ]

%post
    read -r line < /fetched.txt; echo "$line" > /seen-in-post.txt
"""


@pytest.mark.skipif(not Path("/lib/x86_64-linux-gnu/libc.so.6").exists() or not Path("/usr/bin/dash").exists(),
                    reason="needs an x86_64 Debian-like host to assemble a tiny rootfs")
def test_dir_image_on_a_local_directory_image_runs_setup_on_the_host_then_post(tmp_path: Path) -> None:
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    base = tmp_path / "base"
    _tiny_rootfs(base)
    template = tmp_path / "layer.def.j2"
    template.write_text(SETUP_LAYER)
    out = tmp_path / "out"
    outcome = build_image(template, fmt="dir", out_dir=out,
                          variables={"bootstrap": "localimage", "from_image": str(base), "framework_version": "1"})
    assert outcome.built and outcome.plan.action is BuildAction.SCRATCH
    assert (outcome.path / "seen-in-post.txt").read_text() == "fetched on the host\n"   # %setup's file, read by %post
    assert (outcome.path / "usr" / "bin" / "sh").exists() and not (base / "fetched.txt").exists()
    with pytest.raises(SandboxConfigError, match="needs --set from_image=DIR"):
        build_image(template, fmt="dir", out_dir=tmp_path / "out2",
                    variables={"bootstrap": "localimage", "from_image": str(tmp_path / "missing")})


def test_the_harness_template_layers_the_clis_on_an_image(tmp_path: Path) -> None:
    text = render(find_template("harness"), {"from_image": "/images/tasks"}).text
    assert header_fields(text) == {"bootstrap": "localimage", "from": "/images/tasks"}
    parts = sections(text)
    # npm on the host fetches the pinned CLIs without running their scripts; %post runs them in the image.
    assert "npm install --global --prefix \"$ROOTFS/usr/local\" --ignore-scripts" in parts["setup"]
    assert "@anthropic-ai/claude-code@" in parts["setup"] and "@openai/codex@" in parts["setup"]
    assert "apt-get install -y --no-install-recommends nodejs" in parts["post"] and " npm" not in parts["post"]
    assert "claude --version && codex --version" in parts["test"]
    recipe = _spython("Bootstrap: docker\nFrom: debian:bookworm\n\n" + text[text.index("%labels"):], tmp_path)
    assert recipe.install                                               # type: ignore[attr-defined]

"""run.toml parsing: bounds, unknown keys, round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import ConfigError, RunConfig
from orchestrator.spool.rundir import init_run


def test_round_trip_and_overrides(tmp_path: Path) -> None:
    paths, config = init_run(tmp_path / "r", {"pools.run": "16", "jobs.timeout_s": 90})
    assert config.pools.run == 16 and config.jobs.timeout_s == 90.0
    assert RunConfig.load(paths.run_config) == config
    _, again = init_run(tmp_path / "r")  # re-init keeps the settings
    assert again == config
    _, sandboxed = init_run(tmp_path / "r", {"sandbox.network": "true", "sandbox.image": "/images/swe"})
    assert sandboxed.sandbox.defaults() == {
        "network": True, "fakeroot": False, "image": "/images/swe", "keep_workspace": False,
        "limits": {"total_memory_mb": 8192, "workspace_mb": 2048, "processes": 256},
    }
    _, allowing = init_run(tmp_path / "r", {"sandbox.allowed_binds": "/data/mirrors,/opt/harness",
                                            "sandbox.network_handlers": ["shell"]})
    assert allowing.sandbox.allowed_binds == ("/data/mirrors", "/opt/harness")
    assert RunConfig.load(paths.run_config).sandbox.network_handlers == ("shell",)


@pytest.mark.parametrize("key,value,message", [
    ("pools.runn", 1, r"unknown setting 'pools.runn' \(did you mean 'pools.run'\?\); valid: pools.init"),
    ("pools.run", -1, "outside"),
    ("pools.run", 1.5, "whole number"),
    ("jobs.timeout_s", "soon", "not a number"),
    ("sandbox.runtime", "docker", "valid: auto, apptainer, bwrap, local"),
    ("sandbox.network", "yes", "true or false"),
    ("sandbox.allowed_images", ["images"], "must be an absolute path"),
    ("sandbox.allowed_binds", ["/"], "would allow the whole host"),
    ("sandbox.network_handlers", [1], "list of non-empty strings"),
])
def test_bad_settings_name_the_problem(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig().with_overrides({key: value})


def test_bad_files(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text("[pools\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        RunConfig.load(tmp_path / "run.toml")
    (tmp_path / "run.toml").write_text("[nope]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[nope\]"):
        RunConfig.load(tmp_path / "run.toml")
    with pytest.raises(ConfigError, match="hpc-rollout init"):
        RunConfig.load(tmp_path / "missing" / "run.toml")

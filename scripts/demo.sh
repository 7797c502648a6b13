#!/usr/bin/env bash
# The main job end to end on this machine (local workers, no Slurm, no GPU): installs the
# package (and a CPU torch if none is installed), then runs `hpc-rollout demo`: real chat jobs
# against `serve-llm --tiny`. Extra arguments go to `hpc-rollout demo`.
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore   # quiet pip when run as root (CI); older pips ignore it
cd "$(dirname "$0")/.."
# Say where the install goes when no virtual environment (venv, virtualenv, conda) is active.
if python -c 'import os, sys; sys.exit(sys.prefix != sys.base_prefix or bool(os.environ.get("CONDA_PREFIX")))'; then
  echo "[demo.sh] no virtual environment active: installing into $(python -c 'import sys; print(sys.prefix)')" \
       "(to keep it apart: python3 -m venv ~/.venvs/hpc-rollout && . ~/.venvs/hpc-rollout/bin/activate, then run this again)"
fi
# torch: the CPU build. PyPI's torch for Linux x86_64 is the CUDA build (several GB of nvidia-*
# wheels); the `+cpu` version exists only on PyTorch's CPU index (or a local wheelhouse), so
# this installs the CPU build or fails, never CUDA by accident. README "Installing torch".
# Torch alone from that index (--no-deps), then its dependencies from the usual one: pip asks the
# --index-url for every package it resolves, and where that index cannot be reached (an offline
# node with a wheelhouse) each of torch's dependencies waited through pip's retries.
if ! python -c 'import torch' 2>/dev/null; then
  python -m pip install -q --no-deps 'torch==2.13.0+cpu' --index-url https://download.pytorch.org/whl/cpu
  python -m pip install -q 'torch==2.13.0+cpu'
fi
python -m pip install -q -e '.[agents]'
exec hpc-rollout demo "$@"

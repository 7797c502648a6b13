#!/usr/bin/env bash
# verl 0.9.1 for the tests and benchmark of the verl loop manager (orchestrator/trainer/verl/),
# in its own virtualenv under the cache directory, reused between runs.
#
#   bash scripts/verl-setup.sh          # install if needed; last line: the venv's python
#
# Why a venv of its own: verl pins transformers < 5.11 (and pulls ray, tensordict, datasets,
# hydra, wandb, ...), which the main environment need not accept. The venv holds torch (the CPU
# build), verl, and hpc-rollout's own dependencies, NOT hpc-rollout itself: each checkout that
# uses the venv puts its own copy on PYTHONPATH (tests/verl/env.py), so two checkouts testing at
# once never run each other's code.
#
# Lives in ${HPC_ROLLOUT_CACHE:-~/.cache/hpc-rollout}/verl-VERSION (about 2 GB, never in the
# repository). Concurrent callers are safe: one installs (lock directory with its pid), the
# others wait and reuse the result; a dead installer's lock is broken. When hpc-rollout's
# dependencies change (pyproject.toml), only they are installed again. Install log:
# .../verl-VERSION.log. Exit status 1 with the log's tail on failure.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
cd "$(dirname "$0")/.."

VERSION=${VERL_VERSION:-0.9.1}               # the version the manager was verified against
TORCH=${VERL_TORCH:-2.13.0+cpu}
# What verl's trainers import beyond verl's own requirements: three packages of its `verl-core`
# extra for the legacy one (verl.trainer.ppo.ray_trainer), TransferQueue (with pyzmq and msgspec)
# for the v1 one (trainer.use_v1=true); the whole extra also pulls torchcodec, ...
VERL_TRAINER_EXTRAS=(cachetools uvicorn fastapi TransferQueue==0.1.11)
BASE_PYTHON=${VERL_BASE_PYTHON:-python3}
WAIT_S=${VERL_SETUP_WAIT_S:-1800}            # how long to wait for another installer
CHECK_ONLY=${VERL_SETUP_CHECK_ONLY:-0}       # 1: report, do not install (after a background install)
CACHE=${HPC_ROLLOUT_CACHE:-$HOME/.cache/hpc-rollout}
VENV=$CACHE/verl-$VERSION
READY=$VENV/.hpc-rollout-ready               # written last: what is installed (see `wanted`)
LOCK=$CACHE/verl-$VERSION.lock
LOG=$CACHE/verl-$VERSION.log

NAME=verl-setup
# shellcheck source=scripts/cached-install.sh
source "$HERE/cached-install.sh"

# hpc-rollout's runtime dependencies, one per line, straight from pyproject.toml.
project_requirements() {
  "$BASE_PYTHON" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))'
}
REQUIREMENTS=$(project_requirements) || fail "cannot read the dependencies of pyproject.toml"
wanted="verl==$VERSION torch==$TORCH deps:$(printf '%s' "$REQUIREMENTS ${VERL_TRAINER_EXTRAS[*]}" | sha256sum | cut -c1-16)"

[[ -f $READY && $(cat "$READY") == "$wanted" ]] && done_ok
[[ $CHECK_ONLY == 1 ]] && fail "verl is not installed in $VENV (or is out of date): the install did not finish (see its log)"
mkdir -p "$CACHE"

take_install_lock
[[ -f $READY && $(cat "$READY") == "$wanted" ]] && done_ok   # another installer finished meanwhile

mapfile -t requirements <<<"$REQUIREMENTS"
PY=$VENV/bin/python
if [[ -f $READY && $(cut -d' ' -f1-2 "$READY") == "verl==$VERSION torch==$TORCH" ]]; then
  # Same verl and torch: only hpc-rollout's dependencies changed. Seconds, not minutes.
  log "updating hpc-rollout's dependencies in $VENV (log: $LOG)"
  "$PY" -m pip install --progress-bar off --prefer-binary "${requirements[@]}" "${VERL_TRAINER_EXTRAS[@]}" "verl==$VERSION" "torch==$TORCH" >>"$LOG" 2>&1 \
    || fail "pip install of hpc-rollout's dependencies failed"
else
  log "installing verl==$VERSION into $VENV (one time, a few minutes; log: $LOG)"
  : >"$LOG"
  rm -rf "$VENV"
  "$BASE_PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "could not create a venv with $BASE_PYTHON"
  # The CPU build of torch first (the machine's wheelhouse, else PyTorch's CPU index), so that
  # verl's `torch` requirement is met by it and never pulls a CUDA build.
  "$PY" -m pip install --progress-bar off "torch==$TORCH" >>"$LOG" 2>&1 \
    || "$PY" -m pip install --progress-bar off "torch==$TORCH" --index-url https://download.pytorch.org/whl/cpu >>"$LOG" 2>&1 \
    || fail "pip install torch==$TORCH failed"
  # --prefer-binary: never build a dependency from source on a 2-core machine.
  "$PY" -m pip install --progress-bar off --prefer-binary "verl==$VERSION" "torch==$TORCH" "${requirements[@]}" \
    "${VERL_TRAINER_EXTRAS[@]}" >>"$LOG" 2>&1 \
    || fail "pip install verl==$VERSION failed"
fi
got=$("$PY" -c 'import verl, torch; from verl.trainer.ppo import ray_trainer; print(verl.__version__, torch.__version__)' 2>>"$LOG") \
  || fail "the installed verl does not import"
log "verl and torch $got ready in $VENV ($(du -sh "$VENV" | cut -f1))"
echo "$wanted" >"$READY"
done_ok

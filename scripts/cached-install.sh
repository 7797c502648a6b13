# Shared by the scripts that install something heavy once into the cache (vllm-setup.sh,
# verl-setup.sh): source it after setting NAME (log prefix), LOG, LOCK, WAIT_S and VENV.
#
# The lock is a directory made atomically (mkdir), holding the installer's pid: concurrent
# callers on one node wait for it and reuse the result, and a dead installer's lock is broken
# (its pid no longer runs). Node-local on purpose: the cache lives under one node's home.

log() { printf '[%s %s] %s\n' "$NAME" "$(date +%T)" "$*" >&2; }
fail() {
  log "ERROR: $*"
  [[ -f $LOG ]] && { echo "--- last lines of $LOG" >&2; tail -n 25 "$LOG" >&2; }
  exit 1
}
done_ok() { echo "$VENV/bin/python"; exit 0; }

# take_install_lock: wait (up to WAIT_S) for the lock, break a dead holder's, hold it until exit.
take_install_lock() {
  local start=$SECONDS holder
  until mkdir "$LOCK" 2>/dev/null; do
    holder=$(cat "$LOCK/pid" 2>/dev/null || true)
    if [[ -n $holder ]] && ! kill -0 "$holder" 2>/dev/null; then
      log "breaking the lock of a dead installer (pid $holder)"
      rm -rf "$LOCK"
      continue
    fi
    ((SECONDS - start < WAIT_S)) || fail "another install (pid ${holder:-?}) still holds $LOCK after ${WAIT_S}s"
    sleep 2
  done
  echo $$ >"$LOCK/pid"
  trap 'rm -rf "$LOCK"' EXIT
}

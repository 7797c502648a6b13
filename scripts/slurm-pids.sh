# slurm-pids.sh - helpers shared by slurm-up.sh and slurm-down.sh (sourced; the sourcing
# script defines log()): daemons found by pid file and command name, never by name alone,
# and the cancelling of the test cluster's jobs.

# alive PIDFILE COMM: the pid in PIDFILE exists, is not a zombie, and is COMM.
# (PID 1 here does not always reap orphans at once, so "kill -0" is not enough.)
alive() {
  local pid st comm
  [[ -s $1 ]] || return 1
  pid=$(<"$1"); [[ $pid =~ ^[0-9]+$ ]] || return 1
  read -r st comm < <(ps -o stat=,comm= -p "$pid" 2>/dev/null) || return 1
  [[ $st != Z* && $comm == "$2" ]]
}

# stop_pid PIDFILE COMM: TERM, wait up to 20s, then KILL. Only that pid.
stop_pid() {
  alive "$1" "$2" || { rm -f "$1"; return 0; }
  local pid; pid=$(<"$1")
  log "stopping $2 (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do alive "$1" "$2" || break; sleep 0.2; done
  if alive "$1" "$2"; then
    log "$2 (pid $pid) ignored SIGTERM for 20s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

# cancel_all_jobs WHY: cancel every job the controller knows and wait up to 30 s (KillWait +
# epilog) for them to end, so that slurmd has cleaned up their processes. The cluster these
# scripts run is a test cluster of its own: every job on it is ours to cancel.
cancel_all_jobs() {
  local jobs
  mapfile -t jobs < <(timeout 15 squeue -h -o %i 2>/dev/null)
  ((${#jobs[@]})) || return 0
  log "cancelling jobs ($1): ${jobs[*]}"
  timeout 15 scancel "${jobs[@]}" 2>/dev/null || true
  for _ in $(seq 150); do
    timeout 15 squeue -h -t all -o '%i %T' 2>/dev/null |
      grep -qvE 'CANCELLED|COMPLETED|FAILED|TIMEOUT|PREEMPTED|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE' || return 0
    sleep 0.2
  done
  log "jobs still ending after 30 s: $(timeout 15 squeue -h -o '%i %T' 2>/dev/null | tr '\n' ' ')"
}

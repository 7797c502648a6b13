# slurm-pids.sh - pid-file helpers shared by slurm-up.sh and slurm-down.sh (sourced; the
# sourcing script defines log()). Daemons are found by pid file and command name, never by
# name alone.

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

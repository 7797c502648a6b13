#!/usr/bin/env bash
# slurm-down.sh - stop what scripts/slurm-up.sh started, by pid file, in reverse order.
# Jobs are cancelled first so that slurmd can clean up their processes.
#   --purge   also drop the slurm_acct_db database and delete $SLURM_CI_DIR
#             (job ids restart at 1 afterwards; an old accounting record
#             with the same id would otherwise be reported by sacct -j)
set -uo pipefail

: "${SLURM_CI_DIR:=/var/tmp/slurm-ci}"
D=$SLURM_CI_DIR

log() { printf '[slurm-down %s] %s\n' "$(date +%T)" "$*"; }

# alive, stop_pid
source "$(dirname "${BASH_SOURCE[0]}")/slurm-pids.sh"

if alive "$D/run/slurmctld.pid" slurmctld; then
  mapfile -t jobs < <(timeout 15 squeue -h -o %i 2>/dev/null)
  if ((${#jobs[@]})); then
    log "cancelling jobs: ${jobs[*]}"
    timeout 15 scancel "${jobs[@]}" 2>/dev/null || true
    for _ in $(seq 150); do   # up to 30 s (KillWait + epilog)
      timeout 15 squeue -h -t all -o '%i %T' 2>/dev/null |
        grep -qvE 'CANCELLED|COMPLETED|FAILED|TIMEOUT|PREEMPTED|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE' || break
      sleep 0.2
    done
  fi
fi

for pf in "$D"/run/slurmd-*.pid; do [[ -e $pf ]] && stop_pid "$pf" slurmd; done
stop_pid "$D/run/slurmctld.pid" slurmctld
stop_pid "$D/run/slurmdbd.pid" slurmdbd
if [[ ${1:-} == --purge ]] && alive /run/mysqld/mysqld.pid mariadbd; then
  log "dropping database slurm_acct_db"
  mariadb -e 'DROP DATABASE IF EXISTS slurm_acct_db' || true
fi
stop_pid /run/mysqld/mysqld.pid mariadbd
stop_pid /run/munge/munged.pid munged

if [[ ${1:-} == --purge ]]; then
  log "removing $D"
  rm -rf "$D"
fi
log "done"

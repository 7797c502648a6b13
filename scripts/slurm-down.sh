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

# alive, stop_pid, cancel_all_jobs
source "$(dirname "${BASH_SOURCE[0]}")/slurm-pids.sh"

if alive "$D/run/slurmctld.pid" slurmctld; then
  cancel_all_jobs "stopping the cluster"
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

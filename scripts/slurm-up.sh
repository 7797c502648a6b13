#!/usr/bin/env bash
# slurm-up.sh - install (Debian 12 packages) and start a single-host Slurm
# cluster for hpc-rollout's tests, CI and benchmarks: munged, [mariadbd +
# slurmdbd], slurmctld and one slurmd per emulated node (Debian's slurmd is built with multiple-slurmd
# support). Runs as root, needs no systemd. Idempotent: if everything is
# already up with the same configuration it only re-checks and exits.
#
# Knobs (environment variables):
#   SLURM_CI_DIR       state/log/pid directory       (default /var/tmp/slurm-ci)
#   SLURM_NODES        number of emulated nodes      (default 4: tests spread over 4)
#   SLURM_CPUS         CPUs advertised per node      (default 8)
#   SLURM_GPUS         GPUs advertised per node      (default 4; fake devices: lets
#                      GPU requests be scheduled and --test-only'd, 0 = none)
#   SLURM_MEM_MB       RealMemory per node, MB       (default: physical RAM - 512)
#   SLURM_ACCOUNTING   dbd | none                    (default dbd; sacct needs dbd)
#   SLURM_CLUSTER      ClusterName                   (default ci)
#   SLURM_NODE_PREFIX  node names PREFIX1..PREFIXn   (default node)
#   SLURM_KILLWAIT     seconds SIGTERM->SIGKILL      (default 5; Slurm default 30)
#   SLURM_MAX_ARRAY_SIZE  MaxArraySize               (default 8, so that launch's
#                      split of larger arrays runs for real; Slurm default 1001)
#   SLURM_CRED_EXPIRE  also = delay before a requeued job may restart
#                      (default 10; Slurm default 120)
#   SLURM_WAIT         seconds to wait for each daemon (default 60)
#   SLURM_EDIT_HOSTS   1: add node names to /etc/hosts (default 1)
set -euo pipefail

: "${SLURM_CI_DIR:=/var/tmp/slurm-ci}"
: "${SLURM_NODES:=4}"
: "${SLURM_CPUS:=8}"
: "${SLURM_GPUS:=4}"
: "${SLURM_MEM_MB:=$(( $(awk '/^MemTotal:/{print $2}' /proc/meminfo) / 1024 - 512 ))}"
: "${SLURM_ACCOUNTING:=dbd}"
: "${SLURM_CLUSTER:=ci}"
: "${SLURM_NODE_PREFIX:=node}"
: "${SLURM_KILLWAIT:=5}"
: "${SLURM_MAX_ARRAY_SIZE:=8}"
: "${SLURM_CRED_EXPIRE:=10}"
: "${SLURM_WAIT:=60}"
: "${SLURM_EDIT_HOSTS:=1}"

D=$SLURM_CI_DIR
DB_PASS=slurmci   # local-only MariaDB account used by slurmdbd

log() { printf '[slurm-up %s] %s\n' "$(date +%T)" "$*"; }
die() {
  log "ERROR: $*"
  for f in "$D"/log/*.log; do [[ -f $f ]] && { echo "--- tail $f"; tail -n 20 "$f"; }; done
  exit 1
}

# alive PIDFILE COMM: the pid in PIDFILE exists, is not a zombie, and is COMM.
# (PID 1 here does not always reap orphans at once, so "kill -0" is not enough.)
alive() {
  local pid st comm
  [[ -s $1 ]] || return 1
  pid=$(<"$1"); [[ $pid =~ ^[0-9]+$ ]] || return 1
  read -r st comm < <(ps -o stat=,comm= -p "$pid" 2>/dev/null) || return 1
  [[ $st != Z* && $comm == "$2" ]]
}

# wait_for SECONDS CMD...: retry CMD every 0.2s until it succeeds
wait_for() {
  local end=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || return 1
    sleep 0.2
  done
}

# stop_pid PIDFILE COMM: TERM, wait up to 20s, then KILL. Only that pid.
stop_pid() {
  alive "$1" "$2" || { rm -f "$1"; return 0; }
  local pid; pid=$(<"$1")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do alive "$1" "$2" || break; sleep 0.2; done
  alive "$1" "$2" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$1"
}

[[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts daemons); stop with scripts/slurm-down.sh"
t_start=$SECONDS

# ---------------------------------------------------------------- packages --
pkgs=(munge slurm-client slurmctld slurmd)
[[ $SLURM_ACCOUNTING == dbd ]] && pkgs+=(slurmdbd mariadb-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Keep package scripts from starting services (no init system here).
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get -q -o DPkg::Lock::Timeout=300 update >/dev/null
  apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "${missing[@]}" >/dev/null
  log "packages installed ($((SECONDS - t_start))s)"
fi

mkdir -p "$D"/{log,run,ctld}
for i in $(seq 1 "$SLURM_NODES"); do mkdir -p "$D/slurmd-$SLURM_NODE_PREFIX$i"; done

# ------------------------------------------------------------------ config --
host=$(hostname)
nodes=""
gres=""
gres_types=""
if ((SLURM_GPUS > 0)); then
  gres=" Gres=gpu:$SLURM_GPUS"
  gres_types="GresTypes=gpu"
fi
for i in $(seq 1 "$SLURM_NODES"); do
  nodes+="NodeName=$SLURM_NODE_PREFIX$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((6820 + i)) CPUs=$SLURM_CPUS RealMemory=$SLURM_MEM_MB$gres State=UNKNOWN"$'\n'
done
if [[ $SLURM_ACCOUNTING == dbd ]]; then
  acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"
else
  acct="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt"
fi

mkdir -p /etc/slurm
cat > "$D/slurm.conf.new" <<EOF
# generated by slurm-up.sh
ClusterName=$SLURM_CLUSTER
SlurmctldHost=localhost
SlurmctldPort=6817
AuthType=auth/munge
AuthInfo=cred_expire=$SLURM_CRED_EXPIRE
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/ctld
SlurmdSpoolDir=$D/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
# track job processes by parent pid, no CPU binding: needs no cgroups (the
# CPUs advertised below may exceed the real ones)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# start batch jobs at submit time (default: may wait up to 3 s) and re-run the
# schedulers every 2 s (defaults 60 s/30 s; matters for requeued jobs)
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2
# advertise more CPUs/memory than the hardware has
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
$gres_types
MailProg=/bin/true
KillWait=$SLURM_KILLWAIT
MaxArraySize=$SLURM_MAX_ARRAY_SIZE
InactiveLimit=0
# preemption: jobs in "high" requeue jobs in "debug"; --signal is sent at preemption
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
$acct
$nodes
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10
EOF
conf_changed=0
cmp -s "$D/slurm.conf.new" /etc/slurm/slurm.conf || conf_changed=1
mv -f "$D/slurm.conf.new" /etc/slurm/slurm.conf

# Emulated GPUs: slurmd counts gpu gres only from device files (Count alone reports 0),
# so give it links to /dev/null (no mknod: containers often lack CAP_MKNOD); nothing is
# bound or constrained (TaskPlugin=task/none).
: > "$D/gres.conf.new"
if ((SLURM_GPUS > 0)); then
  mkdir -p "$D/dev"
  for ((g = 0; g < SLURM_GPUS; g++)); do
    [[ -L $D/dev/gpu$g ]] || { rm -f "$D/dev/gpu$g"; ln -s /dev/null "$D/dev/gpu$g"; }
  done
  printf 'AutoDetect=off\nName=gpu File=%s/dev/gpu[0-%d]\n' "$D" $((SLURM_GPUS - 1)) >> "$D/gres.conf.new"
fi
cmp -s "$D/gres.conf.new" /etc/slurm/gres.conf || conf_changed=1
mv -f "$D/gres.conf.new" /etc/slurm/gres.conf

if [[ $SLURM_ACCOUNTING == dbd ]]; then
  cat > "$D/slurmdbd.conf.new" <<EOF
# generated by slurm-up.sh
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=$D/run/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$D/slurmdbd.conf.new"
  cmp -s "$D/slurmdbd.conf.new" /etc/slurm/slurmdbd.conf || conf_changed=1
  mv -f "$D/slurmdbd.conf.new" /etc/slurm/slurmdbd.conf
fi

if ((SLURM_EDIT_HOSTS)); then
  for i in $(seq 1 "$SLURM_NODES"); do
    getent hosts "$SLURM_NODE_PREFIX$i" >/dev/null ||
      echo "127.0.0.1 $SLURM_NODE_PREFIX$i # slurm-ci" >> /etc/hosts
  done
fi

if ((conf_changed)); then
  log "configuration changed: restarting any running slurm daemons"
  for pf in "$D"/run/slurmd-*.pid; do [[ -e $pf ]] && stop_pid "$pf" slurmd; done
  stop_pid "$D/run/slurmctld.pid" slurmctld
  stop_pid "$D/run/slurmdbd.pid" slurmdbd
fi

# Re-create the state directories right before the daemons need them: a
# package script running in the background once removed them under our feet.
mkdir -p "$D"/{log,run,ctld}

# ------------------------------------------------------------------- munge --
if [[ ! -s /etc/munge/munge.key ]]; then   # normally created by munge's postinst
  install -d -o munge -g munge -m 0700 /etc/munge
  mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 0600 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 0755 /run/munge
if ! alive /run/munge/munged.pid munged; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged --force
fi
wait_for 10 bash -c 'munge -n | unmunge' || die "munge does not work"

# -------------------------------------------------------- mariadb/slurmdbd --
if [[ $SLURM_ACCOUNTING == dbd ]]; then
  install -d -o mysql -g root -m 0755 /run/mysqld
  if [[ ! -d /var/lib/mysql/mysql ]]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >"$D/log/mariadb-install.log" 2>&1
  fi
  if ! alive /run/mysqld/mysqld.pid mariadbd; then
    log "starting mariadbd"
    setsid /usr/sbin/mariadbd --user=mysql </dev/null >>"$D/log/mariadb.log" 2>&1 &
  fi
  wait_for "$SLURM_WAIT" mariadb -e 'SELECT 1' || die "mariadb did not start"
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  if ! alive "$D/run/slurmdbd.pid" slurmdbd; then
    log "starting slurmdbd"
    slurmdbd
  fi
  wait_for "$SLURM_WAIT" sacctmgr -n list cluster || die "slurmdbd did not answer"
fi

# ---------------------------------------------------------- slurmctld/slurmd --
if ! alive "$D/run/slurmctld.pid" slurmctld; then
  log "starting slurmctld"
  slurmctld -i
fi
wait_for "$SLURM_WAIT" scontrol ping || die "slurmctld did not answer"

for i in $(seq 1 "$SLURM_NODES"); do
  n=$SLURM_NODE_PREFIX$i
  if ! alive "$D/run/slurmd-$n.pid" slurmd; then
    log "starting slurmd -N $n"
    slurmd -N "$n"
  fi
done

# all nodes registered and usable: idle (or busy, when re-run with jobs running)
nodes_up() {
  local states
  states=$(sinfo -h -N -o '%N %t' | sort -u)
  [[ $(wc -l <<<"$states") -ge $SLURM_NODES ]] || return 1
  ! grep -qvE ' (idle|mix|alloc|comp)$' <<<"$states"
}
# A node drained under an earlier configuration (saved controller state) stays drained:
# this cluster is ours, so return such nodes to service once they have registered.
resume_stale() {
  local n
  # (22.05's `sinfo -t` knows no "inval" state: filter the short state names ourselves)
  for n in $(sinfo -h -N -o '%N %t' | awk '$2 ~ /^(drain|drng|inval)/ {print $1}' | sort -u); do
    scontrol update nodename="$n" state=resume 2>/dev/null || true
  done
}
sleep 1; resume_stale
wait_for "$SLURM_WAIT" nodes_up || { sinfo -N -o '%N %t %E'; die "nodes did not become idle"; }

if [[ $SLURM_ACCOUNTING == dbd ]]; then
  # slurmctld registers the cluster in slurmdbd by itself; wait for it so that
  # sacct knows about the very first job.
  wait_for "$SLURM_WAIT" bash -c "sacctmgr -n -P list cluster format=cluster,controlhost | grep -q '^$SLURM_CLUSTER|.'" ||
    die "cluster $SLURM_CLUSTER not registered in slurmdbd"
fi

sinfo
log "slurm is up ($((SECONDS - t_start))s)"

#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (Debian, root, no systemd), for perflab's cluster
# tests: munge, slurmctld, slurmd, and slurmdbd + MariaDB (submitit polls sacct: without
# accounting a cancelled or OOM-killed job would leave it waiting forever). All state lives in
# $T; the daemons' PIDs go to $T/run/*.pid so that down.sh stops exactly these and nothing else.
#
#   T=/tmp/perflab-slurm FAKE_GPUS=2 bash tools/cluster/up.sh && . /tmp/perflab-slurm/env.sh
#
# FAKE_GPUS=N: the node advertises N GPUs (gres bound to tty devices: nothing real), so a test
# can read what each job asked for in `sacct -X -o JobID,AllocTRES`. Cores and memory are
# constrained by cgroups: a job sees only the CPUs it asked for, and is killed past its memory.
set -euo pipefail
T=${T:-${TMPDIR:-/tmp}/perflab-slurm}
FAKE_GPUS=${FAKE_GPUS:-0}
DBPORT=${DBPORT:-3306}
PKGS="slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
dpkg -s $PKGS >/dev/null 2>&1 || { apt-get update -qq &&
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS >/dev/null; }

mkdir -p "$T"/{etc,state,spool,run,log}
chmod 755 "$T"  # mysql must be able to traverse it
export SLURM_CONF=$T/etc/slurm.conf
echo "export SLURM_CONF=$SLURM_CONF" > "$T/env.sh"
H=$(uname -n); H=${H%%.*}  # the short name slurmd knows itself by; addresses are loopback

alive() { [ -f "$T/run/$1.pid" ] && kill -0 "$(cat "$T/run/$1.pid")" 2>/dev/null; }
start() {  # start NAME CMD...: a daemon in the foreground, detached from us, its PID recorded
  local name=$1; shift
  alive "$name" && return 0
  setsid "$@" > "$T/log/$name.out" 2>&1 < /dev/null &
  echo $! > "$T/run/$name.pid"
}
until_ok() { for _ in $(seq 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done; "$@"; }

# munge: Debian's package made the key; make one if it did not
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge
install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
munge -n </dev/null >/dev/null 2>&1 || start munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F
until_ok sh -c 'munge -n </dev/null | unmunge'

# accounting: MariaDB, then slurmdbd
install -d -o mysql -g mysql "$T/mysql" "$T/mysql-run"
runuser -u mysql -- test -x "$T/mysql" || {
  echo "up: the mysql user cannot reach $T (a parent directory is closed to others): choose T under /tmp" >&2
  exit 1
}
[ -d "$T/mysql/mysql" ] || mariadb-install-db --user=mysql --datadir="$T/mysql" --auth-root-authentication-method=socket \
  > "$T/log/mariadb-install.log" 2>&1
start mariadbd /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$T/mysql" --socket="$T/mysql-run/sock" \
  --pid-file="$T/mysql-run/pid" --bind-address=127.0.0.1 --port="$DBPORT" --innodb-buffer-pool-size=64M \
  --performance-schema=off
until_ok mariadb --socket="$T/mysql-run/sock" -u root -e 'select 1'
mariadb --socket="$T/mysql-run/sock" -u root -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
cat > "$T/etc/slurmdbd.conf" <<EOC
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$T/log/slurmdbd.log
PidFile=$T/run/slurmdbd.daemon.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DBPORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOC
chmod 600 "$T/etc/slurmdbd.conf"
start slurmdbd /usr/sbin/slurmdbd -D
until_ok grep -q "slurmdbd version .* started" "$T/log/slurmdbd.log"

# slurm.conf: this machine as the one node, cores and memory enforced by cgroups
printf 'CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainDevices=no\n' > "$T/etc/cgroup.conf"
GRES="" GRES_TYPES=""
if [ "$FAKE_GPUS" -gt 0 ]; then
  GRES="Gres=gpu:$FAKE_GPUS" GRES_TYPES="GresTypes=gpu"
  echo "NodeName=$H Name=gpu File=/dev/tty[0-$((FAKE_GPUS - 1))]" > "$T/etc/gres.conf"
fi
MEM=$(( $(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p') * 95 / 100 ))
cat > "$T/etc/slurm.conf" <<EOC
ClusterName=perflab
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/run/slurmctld.daemon.pid
SlurmdPidFile=$T/run/slurmd.daemon.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
MpiDefault=none
$GRES_TYPES
NodeName=$H NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$MEM $GRES State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOC
start slurmctld /usr/sbin/slurmctld -D -i
until_ok sh -c 'scontrol ping | grep -q UP'
start slurmd /usr/sbin/slurmd -D
for _ in $(seq 100); do sinfo -h -o %T | grep -qx idle && break; sleep 0.3; done
sinfo
echo "up: . $T/env.sh   (stop: T=$T bash tools/cluster/down.sh)"

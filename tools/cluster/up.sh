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
#
# Partitions: `debug` (the default; this machine), `urgent` (the same node, a higher priority
# tier: a job there preempts, i.e. requeues, a `debug` job; a requeued job starts again after
# cred_expire, 30 s here rather than SLURM's 120), and, unless MULTINODE=0, `multi`:
# two more nodes n1 and n2, each a slurmd in its own network, UTS and mount namespace (own
# address on a bridge, own hostname and /etc/hosts), so a multi-node job really spans two
# hosts that reach each other by name, as on a cluster. Where namespaces cannot be made, up.sh
# says so and the cluster has the one node.
set -euo pipefail
T=${T:-${TMPDIR:-/tmp}/perflab-slurm}
FAKE_GPUS=${FAKE_GPUS:-0}
MULTINODE=${MULTINODE:-1}
NET=${NET:-10.77.0}  # the bridge's /24 for the multi partition: .1 this machine, .2 n1, .3 n2
DBPORT=${DBPORT:-3306}
PKGS="slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
dpkg -s $PKGS >/dev/null 2>&1 || { apt-get update -qq &&
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS >/dev/null; }
# iproute2 for the multi partition only: without it, one node and no multi partition
command -v ip >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 >/dev/null || true

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

# the multi partition's network: a bridge here, a veth into each node's namespace
CTLD_ADDR=127.0.0.1 MULTI_NODES=""
multinode_net() {
  ip link add plab0 type bridge || return 1
  echo "link plab0" >> "$T/run/net"  # after what net-down.sh could not remove, if anything
  ip addr add "$NET.1/24" dev plab0 && ip link set plab0 up || return 1
  local i
  for i in 1 2; do
    ip netns add "perflab-n$i" && echo "netns perflab-n$i" >> "$T/run/net" || return 1
    ip link add "plab-n$i" type veth peer name eth0 netns "perflab-n$i" || return 1
    ip link set "plab-n$i" master plab0 && ip link set "plab-n$i" up || return 1
    nsenter --net="/run/netns/perflab-n$i" sh -c \
      "ip addr add $NET.$((i + 1))/24 dev eth0 && ip link set eth0 up && ip link set lo up" || return 1
  done
  printf '127.0.0.1 localhost\n%s.1 %s\n%s.2 n1\n%s.3 n2\n' "$NET" "$H" "$NET" "$NET" > "$T/etc/hosts.multi"
}
if [ "$MULTINODE" = 1 ]; then
  net_ok() { [ -f "$T/run/net.ok" ] && [ -e /run/netns/perflab-n1 ] && [ -e /run/netns/perflab-n2 ] && ip link show plab0 >/dev/null 2>&1; }
  if net_ok || { T=$T bash "$(dirname "$0")/net-down.sh" >/dev/null; multinode_net 2> "$T/log/net.err"; }; then
    touch "$T/run/net.ok"
    CTLD_ADDR=$NET.1 MULTI_NODES=1
  else
    T=$T bash "$(dirname "$0")/net-down.sh" >/dev/null
    echo "up: no multi partition (cannot make network namespaces here: $(tail -1 "$T/log/net.err"))" >&2
  fi
fi

# slurm.conf: this machine as the one node, cores and memory enforced by cgroups
printf 'CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainDevices=no\n' > "$T/etc/cgroup.conf"
GRES="" GRES_TYPES=""
if [ "$FAKE_GPUS" -gt 0 ]; then
  GRES="Gres=gpu:$FAKE_GPUS" GRES_TYPES="GresTypes=gpu"
  echo "NodeName=$H Name=gpu File=/dev/tty[0-$((FAKE_GPUS - 1))]" > "$T/etc/gres.conf"
fi
MEM=$(( $(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p') * 95 / 100 ))
MULTI=""
if [ -n "$MULTI_NODES" ]; then  # each of n1, n2: all the CPUs, a third of the memory (they share this machine)
  MULTI="NodeName=n1 NodeAddr=$NET.2 CPUs=$(nproc) RealMemory=$((MEM / 3)) State=UNKNOWN
NodeName=n2 NodeAddr=$NET.3 CPUs=$(nproc) RealMemory=$((MEM / 3)) State=UNKNOWN
PartitionName=multi Nodes=n1,n2 MaxTime=INFINITE State=UP"
fi
cat > "$T/etc/slurm.conf" <<EOC
ClusterName=perflab
SlurmctldHost=$H($CTLD_ADDR)
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=30
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/run/slurmctld.daemon.pid
SlurmdPidFile=$T/run/slurmd.%n.daemon.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.%n.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
MpiDefault=none
$GRES_TYPES
NodeName=$H NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$MEM $GRES State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=$H MaxTime=INFINITE State=UP PriorityTier=2
$MULTI
EOC
mkdir -p "$T/spool/$H" "$T/spool/n1" "$T/spool/n2"
start slurmctld /usr/sbin/slurmctld -D -i
until_ok sh -c 'scontrol ping | grep -q UP'
start slurmd /usr/sbin/slurmd -D
if [ -n "$MULTI_NODES" ]; then
  for n in n1 n2; do  # a slurmd in the node's namespaces, with its own hostname and hosts file
    start "slurmd-$n" nsenter --net="/run/netns/perflab-$n" unshare --uts --mount sh -c \
      "hostname $n && mount --bind $T/etc/hosts.multi /etc/hosts && exec /usr/sbin/slurmd -D"
  done
fi
for _ in $(seq 100); do  # until every node is idle
  states=$(sinfo -h -N -o %T) || states=""
  [ -n "$states" ] && [ -z "$(echo "$states" | grep -vx idle)" ] && break
  sleep 0.3
done
sinfo
if [ -n "$MULTI_NODES" ] && [ "$(sinfo -h -N -p multi -t idle -o %N | sort -u | wc -l)" -lt 2 ]; then
  echo "up: no multi partition (n1/n2 did not register: see $T/log/slurmd.n1.log)" >&2
fi
echo "up: . $T/env.sh   (stop: T=$T bash tools/cluster/down.sh)"

#!/usr/bin/env bash
# A real one-node SLURM cluster for the tests labelled `slurm` (the CTest fixture
# slurm_cluster): Debian's munged, slurmctld and slurmd, configured for this host and run as
# root with everything (key, sockets, state, spool, logs) under DIR, so nothing in /etc is
# touched and a second cluster elsewhere is not disturbed.
#   slurm_cluster.sh start DIR   # writes DIR/slurm.conf, starts the daemons, waits for the node
#   slurm_cluster.sh stop DIR    # stops them (and whatever jobs they still run)
# The tests point SLURM_CONF at DIR/slurm.conf. The node offers 64 CPUs and 8 GPUs as a
# count-only GRES (whatever the machine has: CI's has 2 cores and no GPU), so the example GPU
# script's lines fit it under sbatch --test-only, and up to 4 jobs share the CPUs
# (OverSubscribe=FORCE:4) as the tests run side by side.
set -euo pipefail
action=$1 dir=$(realpath -m "$2")
ctld_port=${ZTRAIN_SLURMCTLD_PORT:-16817} slurmd_port=${ZTRAIN_SLURMD_PORT:-16818}

stop() {
  for daemon in slurmd slurmctld munged; do
    local pidfile="$dir/$daemon.pid"
    [ -f "$pidfile" ] || continue
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  # Steps the daemons started (slurmstepd and the tasks below it) end with them.
  pkill -f "slurmstepd: \[" 2>/dev/null || true
}

fail() {
  echo "slurm_cluster: $*"
  for log in munged slurmctld slurmd; do
    [ -f "$dir/$log.log" ] && { echo "--- $dir/$log.log"; tail -n 30 "$dir/$log.log"; }
  done
  stop
  exit 1
}

case "$action" in
  stop) stop; exit 0;;
  start) ;;
  *) echo "usage: $0 start|stop DIR"; exit 2;;
esac

for tool in munged slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "$tool" > /dev/null || {
    echo "slurm_cluster: $tool is missing; install it with: apt-get install slurmctld slurmd slurm-client munge (scripts/install_deps.sh does)"
    exit 1
  }
done
stop  # a cluster a killed test run left behind
rm -rf "$dir"
mkdir -p "$dir"/{state,spool,munge}
chmod 700 "$dir/munge"
head -c 1024 /dev/urandom > "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" ||
  fail "munged did not start"

host=$(hostname -s)
cat > "$dir/slurm.conf" <<CONF
# One-node cluster for ztrain's tests (tests/slurm/slurm_cluster.sh).
ClusterName=ztrain-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: processes are tracked by their parents, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobRequeue=1
ReturnToService=2
KillWait=10
InactiveLimit=0
MinJobAge=600
SchedulerType=sched/backfill
# The node's CPUs and memory as written here, not as the (smaller) machine reports them.
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=64 Sockets=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=16000 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
# Eight placeholder files stand for the GPUs: SLURM only counts and hands them out.
mkdir -p "$dir/dev"
touch "$dir"/dev/gpu{0..7}
printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/dev/gpu[0-7]\n' "$host" "$dir" > "$dir/gres.conf"
export SLURM_CONF="$dir/slurm.conf"
slurmctld || fail "slurmctld did not start"
slurmd || fail "slurmd did not start"
for _ in $(seq 100); do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -n1 || true)
  case "$state" in idle|mix|alloc) echo "slurm_cluster: node $host is $state ($SLURM_CONF)"; exit 0;; esac
  sleep 0.2
done
fail "node $host did not come up (state '${state:-unknown}')"

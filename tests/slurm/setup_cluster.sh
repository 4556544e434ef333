#!/usr/bin/env bash
# A one-node SLURM cluster on localhost for the `slurm` tests: partitions `cpu` and `gpu`, two fake GPUs, and a
# default partition `other` that a job lands in only if the profile named none.
#   setup_cluster.sh DIR   (the cluster's files go to DIR/concur-slurm-state)
# Installs Debian's slurmctld, slurmd, slurm-client and munge when missing (root and apt needed), writes
# slurm.conf (linked from /etc/slurm), starts the daemons and waits until the node is idle. The PIDs of what it
# started are left in *.pid and the files it made outside DIR in `created`, for the caller to stop and remove.
# Exit 77: this machine cannot host the cluster (the reason on stderr).
set -euo pipefail

STATE=$(realpath -m "${1:?usage: setup_cluster.sh DIR}")/concur-slurm-state
SKIP=77

skip() { echo "$*" >&2; exit $SKIP; }

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null && return
  [ "$(id -u)" = 0 ] || skip "SLURM is not installed and installing it needs root"
  command -v apt-get >/dev/null || skip "SLURM is not installed and there is no apt-get to install it"
  export DEBIAN_FRONTEND=noninteractive
  local apt=(timeout 300 apt-get -qq -o Acquire::Retries=1 -o Acquire::http::Timeout=30)
  "${apt[@]}" update >&2 || skip "apt-get update failed"
  "${apt[@]}" install -y --no-install-recommends slurmctld slurmd slurm-client munge >&2 \
    || skip "apt-get install of SLURM failed"
}

# gres/gpu needs device files: a count-only GRES leaves the node invalid
fake_gpus() {
  for i in 0 1; do
    [ -e /dev/nvidia$i ] && continue
    mknod /dev/nvidia$i c 195 $i 2>/dev/null || skip "cannot create the fake GPU device files (mknod /dev/nvidia$i)"
    echo /dev/nvidia$i >>"$STATE/created"
  done
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  munge_works && return  # a running munged is reused and left alone
  install -d -o munge -g munge -m 0755 /run/munge
  [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create >&2
  # the munge user cannot enter STATE (pytest's folders are private): its PID file is copied over
  runuser -u munge -- munged --pid-file=/run/munge/concur-test.pid >&2
  for _ in $(seq 50); do
    if munge_works; then cp /run/munge/concur-test.pid "$STATE/munged.pid"; return; fi
    sleep 0.2
  done
  echo "munged did not start" >&2; exit 1
}

write_config() {
  local node cpus mem
  node=$(hostname -s)
  cpus=$(( $(nproc) < 4 ? 4 : $(nproc) ))  # config_overrides: more cores than the machine has are accepted
  mem=256000                               # memory is not a consumable (CR_Core): only requests above it fail
  mkdir -p "$STATE/spool/ctld" "$STATE/spool/d" "$STATE/log"
  cat >"$STATE/slurm.conf" <<EOF
ClusterName=concur-ci
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
MinJobAge=900
InactiveLimit=0
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=other Nodes=$node Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes=$node MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$node MaxTime=INFINITE State=UP
EOF
  echo "Name=gpu File=/dev/nvidia[0-1]" >"$STATE/gres.conf"
}

other_running() { kill -0 "$(cat "$1/slurmctld.pid" 2>/dev/null)" 2>/dev/null; }

# The jobstep plugin drops SLURM_CONF for the srun inside each job, so the configuration must sit at SLURM's
# default path: linked there, unless a configuration of another cluster is already in place.
link_default_config() {
  local etc=/etc/slurm
  mkdir -p $etc
  for name in slurm.conf gres.conf; do
    if [ -e $etc/$name ] || [ -L $etc/$name ]; then
      case "$(readlink $etc/$name)" in
        */concur-slurm-state/$name)  # another test cluster's: left behind, unless its slurmctld still runs
          other_running "$(dirname "$(readlink $etc/$name)")" && skip "another SLURM test cluster is running"
          rm $etc/$name ;;
        *) skip "$etc/$name exists: this machine has its own SLURM configuration" ;;
      esac
    fi
  done
  for name in slurm.conf gres.conf; do
    ln -s "$STATE/$name" $etc/$name
    echo $etc/$name >>"$STATE/created"
  done
}

wait_idle() {
  local deadline=$((SECONDS + 60))
  while [ $SECONDS -lt $deadline ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; do
    case "$(timeout 5 sinfo -h -N -o %T 2>/dev/null | head -1)" in
      idle*) return ;;
    esac
    sleep 0.5
  done
  echo "the node did not become idle:" >&2
  sinfo -N -l >&2 || true
  tail -20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
  exit 1
}

main() {
  install_packages
  [ "$(id -u)" = 0 ] || skip "starting slurmd needs root"
  mkdir -p "$STATE"
  fake_gpus
  start_munge
  write_config
  link_default_config
  export SLURM_CONF=$STATE/slurm.conf
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  wait_idle
  echo "SLURM_CONF=$SLURM_CONF"
}

main

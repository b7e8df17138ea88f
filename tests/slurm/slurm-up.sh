#!/usr/bin/env bash
# tests/slurm/slurm-up.sh: bring up a throw-away single-host SLURM cluster as
# root without systemd (tests/run.sh runs a training job on it).
# Usage: slurm-up.sh BASE_DIR [NNODES] [CPUS_PER_NODE]
#   NNODES=1 -> one node named after $(hostname); NNODES>1 -> virtual nodes n1..nN on this host.
# Prints "export SLURM_CONF=..." on success. PIDs land in $BASE/pids.
set -euo pipefail
BASE=$(realpath -m "${1:?base dir}"); NN=${2:-1}; CPUS=${3:-8}
PORT0=${SLURM_PORT_BASE:-6917}            # ctld=PORT0, slurmd=PORT0+1, virtual nodes PORT0+4..
HOST=$(hostname -s)
mkdir -p "$BASE"/{munge,state,spool,log,tmp}
chmod 755 "$BASE/munge"                    # munged: socket dir needs o+x
: > "$BASE/pids"
# --- munge (own key + socket so we never touch a system munged) ---
dd if=/dev/urandom of="$BASE/munge/munge.key" bs=1 count=1024 status=none
chmod 400 "$BASE/munge/munge.key"
munged --socket="$BASE/munge/munge.socket.2" --key-file="$BASE/munge/munge.key" \
       --pid-file="$BASE/munge/munged.pid" --log-file="$BASE/munge/munged.log" \
       --seed-file="$BASE/munge/munged.seed"
cat "$BASE/munge/munged.pid" >> "$BASE/pids"
munge -S "$BASE/munge/munge.socket.2" -n | unmunge -S "$BASE/munge/munge.socket.2" >/dev/null
# --- slurm.conf ---
if [ "$NN" -eq 1 ]; then
  NODES="NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN"; NODELIST=$HOST; NAMES=$HOST
else
  NODES=""; NAMES=""
  for i in $(seq 1 "$NN"); do
    NODES+="NodeName=n$i NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT0+3+i)) CPUs=$CPUS State=UNKNOWN"$'\n'
    NAMES+="n$i "
  done
  NODELIST="n[1-$NN]"
fi
cat > "$BASE/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT0
SlurmdPort=$((PORT0+1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$BASE/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
TmpFS=$BASE/tmp/%n
SlurmctldPidFile=$BASE/log/slurmctld.pid
SlurmdPidFile=$BASE/log/slurmd.%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
MailProg=/bin/true
$NODES
PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$BASE/slurm.conf"
# --- daemons (-D = foreground; we background them ourselves and keep the PIDs) ---
slurmctld -D -i >"$BASE/log/slurmctld.stdout" 2>&1 &
echo $! >> "$BASE/pids"
for n in $NAMES; do
  mkdir -p "$BASE/spool/$n" "$BASE/tmp/$n"
  slurmd -D -N "$n" >"$BASE/log/slurmd.$n.stdout" 2>&1 &
  echo $! >> "$BASE/pids"
done
# --- wait until every node is idle ---
for _ in $(seq 1 100); do
  if [ "$(sinfo -h -o '%t' 2>/dev/null | sort -u | tr -d ' \n')" = "idle" ]; then
    echo "export SLURM_CONF=$SLURM_CONF"; exit 0
  fi
  sleep 0.2
done
echo "slurm did not come up" >&2; sinfo -N -l >&2 || true; tail -n 20 "$BASE"/log/*.log >&2; exit 1

#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for COMMAND only (docs/compare.md, "On a Slurm cluster"; CI's Slurm
# stage in .ci/run):
#
#   bash scripts/slurm_local.sh COMMAND [ARGS...]
#
# Installs Debian's slurm-wlm and munge when absent (apt-get: needs root), starts munged, slurmctld and slurmd with a
# configuration in a temporary folder (SlurmctldHost and the node's address 127.0.0.1, two free ports, state, spool
# and logs in that folder), runs COMMAND with SLURM_CONF exported, then cancels the cluster's jobs and stops every
# daemon it started, also when COMMAND fails or the script is interrupted (trap). Exits with COMMAND's status.
# SLURM_LOCAL_CPUS and SLURM_LOCAL_MEM_MB (default: every core, 90% of the memory) size the node.
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: bash scripts/slurm_local.sh COMMAND [ARGS...]" >&2
  exit 2
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_local: slurm-wlm and munge are not installed: run as root (the script installs them) or" \
      "'sudo apt-get install slurm-wlm munge'" >&2
    exit 1
  fi
  echo "slurm_local: installing slurm-wlm and munge (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "slurm_local: the daemons run as root (SlurmUser=root) here: run the script as root" >&2
  exit 1
fi

tmp="$(mktemp -d /tmp/slurm-local.XXXXXX)"
chmod 755 "$tmp"
conf="$tmp/slurm.conf"
started=()  # "name pid" of each daemon this script started

stop_all() {
  local status=$?
  set +e
  if [ -n "${SLURM_CONF:-}" ] && [ -f "$conf" ]; then
    scancel --quiet --user "$(id -un)" 2>/dev/null  # this cluster's jobs only (SLURM_CONF points at it)
    for _ in $(seq 1 30); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 1
    done
  fi
  local i name pid
  for ((i = ${#started[@]} - 1; i >= 0; i--)); do  # slurmd, slurmctld, then munged
    read -r name pid <<<"${started[$i]}"
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null
      echo "slurm_local: $name ($pid) did not stop on SIGTERM: killed"
    else
      echo "slurm_local: stopped $name ($pid)"
    fi
  done
  # Anything else the cluster or COMMAND started (a job step's slurmstepd, a job) has SLURM_CONF=$conf in its
  # environment: this shell's own helpers below must not.
  unset SLURM_CONF
  local left=0 proc
  for proc in /proc/[0-9]*; do
    if { tr '\0' '\n' <"$proc/environ" | grep -qxF "SLURM_CONF=$conf"; } 2>/dev/null; then
      kill -9 "${proc#/proc/}" 2>/dev/null && left=$((left + 1))
    fi
  done
  echo "slurm_local: $left other process(es) with this cluster's SLURM_CONF were left: killed"
  if [ "$status" -ne 0 ] && [ -d "$tmp/log" ]; then
    for log in "$tmp"/log/*.log; do echo "--- $log (last lines)"; tail -n 15 "$log"; done
  fi
  rm -rf "$tmp"
  exit "$status"
}
trap stop_all EXIT
cmd=""  # COMMAND's pid while it runs: a signal to this script stops it too, then the daemons
on_signal() {
  [ -n "$cmd" ] && kill -TERM "$cmd" 2>/dev/null && wait "$cmd" 2>/dev/null
  exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

# munge, with its own socket, key copy and pid file in the temporary folder (a munged already running is left alone)
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log"
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null || /usr/sbin/create-munge-key -f
fi
install -o munge -g munge -m 0400 /etc/munge/munge.key "$tmp/munge/munge.key"
chown munge:munge "$tmp/munge" && chmod 0755 "$tmp/munge"  # munged: its socket's folder open to all
runuser -u munge -- munged --socket "$tmp/munge/munge.socket" --key-file "$tmp/munge/munge.key" \
  --pid-file "$tmp/munge/munged.pid" --log-file "$tmp/munge/munged.log" --seed-file "$tmp/munge/munged.seed"
for _ in $(seq 1 50); do [ -s "$tmp/munge/munged.pid" ] && break; sleep 0.1; done
started+=("munged $(cat "$tmp/munge/munged.pid")")
munge --socket "$tmp/munge/munge.socket" -n | unmunge --socket "$tmp/munge/munge.socket" >/dev/null

read -r ctld_port d_port < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
host="$(hostname -s)"
cpus="${SLURM_LOCAL_CPUS:-$(getconf _NPROCESSORS_ONLN)}"  # not nproc: it reads OMP_NUM_THREADS
mem_mb="${SLURM_LOCAL_MEM_MB:-$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)}"
cat >"$conf" <<EOF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/munge.socket
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/ctld.pid
SlurmdPidFile=$tmp/d.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
ReturnToService=2
SlurmUser=root
SlurmdUser=root
MpiDefault=none
KillWait=5
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$conf"  # daemons and clients alike; the job steps inherit it (how stop_all finds leftovers)

slurmctld -f "$conf"
for _ in $(seq 1 50); do [ -s "$tmp/ctld.pid" ] && break; sleep 0.1; done
started+=("slurmctld $(cat "$tmp/ctld.pid")")
slurmd -f "$conf"
for _ in $(seq 1 50); do [ -s "$tmp/d.pid" ] && break; sleep 0.1; done
started+=("slurmd $(cat "$tmp/d.pid")")
for _ in $(seq 1 60); do
  state="$(sinfo -h -o %T 2>/dev/null || true)"
  [ "$state" = "idle" ] && break
  sleep 0.5
done
if [ "$state" != "idle" ]; then
  echo "slurm_local: the node did not become idle (sinfo: '${state:-no answer}')" >&2
  exit 1
fi
echo "slurm_local: cluster up (SLURM_CONF=$conf, ports $ctld_port/$d_port, $cpus CPUs, $mem_mb MB):" \
  "${started[*]}"

set +e
"$@" &  # in the background, so that a signal reaches the trap at once (bash defers it for a foreground command)
cmd=$!
wait "$cmd"
status=$?
cmd=""
set -e
exit "$status"

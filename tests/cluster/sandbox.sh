#!/usr/bin/env bash
# sandbox.sh - a real multi-node Slurm cluster on one Debian 12 host, for hpc_train's tests.
#
# Each compute node is a slurmd in its own network namespace (own IP on a bridge) and UTS
# namespace (own hostname), with a private mount namespace in which $SANDBOX_DIR/etc/hosts is
# bind-mounted over /etc/hosts. slurmctld, slurmdbd, MariaDB and munged run in the host's
# namespaces. Nodes share the host's filesystem, so job scripts, the repo and its .venv are
# visible everywhere. All state lives under $SANDBOX_DIR. Runs as root.
#
# Packages: bash tests/cluster/install-deps.sh
#
# Usage: sandbox.sh up|down|status|env|reset
#   up      start munged, mariadbd, slurmdbd, slurmctld and the slurmd nodes; idempotent;
#           returns when every node is idle; the last line on stdout is
#           "export SLURM_CONF=$SANDBOX_DIR/etc/slurm.conf"
#   down    cancel jobs, stop the daemons started here (pid files, then any stray daemon
#           whose command line/environment points into $SANDBOX_DIR), kill whatever is left in
#           the node namespaces, remove the namespaces and the bridge
#   status  show daemons and sinfo; exit 0 when everything runs and answers, 3 otherwise
#   env     print "export SLURM_CONF=..."
#   reset   down, then delete all state (Slurm state, logs, accounting database, job folders)
#
# Environment knobs (defaults):
#   HPC_TRAIN_SANDBOX_DIR=/tmp/hpc_train-sandbox   (slurm.conf is $DIR/etc/slurm.conf)
#   HPC_TRAIN_SANDBOX_NODES=3   HPC_TRAIN_SANDBOX_CPUS=8 (per node, may exceed real cores: the tests' jobs mostly
#           wait, and several test workers submit at once; 8 slots a node keep their jobs from queueing)
#   HPC_TRAIN_SANDBOX_GPUS=4 (fake, per node; 0 = none)   HPC_TRAIN_SANDBOX_MEM=4000 (MB per node)
#   HPC_TRAIN_SANDBOX_ACCOUNTING=1 (0 = no slurmdbd/MariaDB; sacct will not work)
#   HPC_TRAIN_SANDBOX_TASK_PLUGIN=task/none (task/affinity: Slurm binds each task to its CPUs;
#           then keep CPUS <= the host's cores, which every node shares)
#   HPC_TRAIN_SANDBOX_NET=10.77.0 (a /24 on the bridge only; .1 = controller, .1N = node N)
#   HPC_TRAIN_SANDBOX_PREFIX=hts (netns/link names: htsbr0, htsn1, htsveth1, ...)
#   HPC_TRAIN_SANDBOX_PORT=16817 (slurmctld; slurmd = +1, slurmdbd = +2)
#   HPC_TRAIN_SANDBOX_DB_PORT=13306 (MariaDB, bound to 127.0.0.1)
#   HPC_TRAIN_SANDBOX_MIN_JOB_AGE=3600 (seconds finished jobs stay visible in squeue -j/scontrol)
#   HPC_TRAIN_SANDBOX_MAX_ARRAY_SIZE=8  (job arrays hold at most this many tasks, indices 0..7)
#   HPC_TRAIN_SANDBOX_MAX_JOB_COUNT=100000 (job records the controller keeps, finished ones for MinJobAge)
set -euo pipefail

SANDBOX_DIR=${HPC_TRAIN_SANDBOX_DIR:-/tmp/hpc_train-sandbox}
LAB=$SANDBOX_DIR
NODES=${HPC_TRAIN_SANDBOX_NODES:-3}
CPUS=${HPC_TRAIN_SANDBOX_CPUS:-8}
GPUS=${HPC_TRAIN_SANDBOX_GPUS:-4}
MEM=${HPC_TRAIN_SANDBOX_MEM:-4000}
ACCT=${HPC_TRAIN_SANDBOX_ACCOUNTING:-1}
TASK_PLUGIN=${HPC_TRAIN_SANDBOX_TASK_PLUGIN:-task/none}
NET=${HPC_TRAIN_SANDBOX_NET:-10.77.0}
PFX=${HPC_TRAIN_SANDBOX_PREFIX:-hts}
CTLD_PORT=${HPC_TRAIN_SANDBOX_PORT:-16817}
SLURMD_PORT=$((CTLD_PORT + 1))
DBD_PORT=$((CTLD_PORT + 2))
DB_PORT=${HPC_TRAIN_SANDBOX_DB_PORT:-13306}
MIN_JOB_AGE=${HPC_TRAIN_SANDBOX_MIN_JOB_AGE:-3600}
# deliberately small: sweeps larger than this must be split into several arrays (issue 9)
MAX_ARRAY_SIZE=${HPC_TRAIN_SANDBOX_MAX_ARRAY_SIZE:-8}
# Slurm's default is 10,000: bench/sweep.py's 10,000-task sweep beside raw sbatch's (issue 33) needs twice
# that, every task kept for MinJobAge after its cancel. A table of pointers, ~1 MB at this size
MAX_JOB_COUNT=${HPC_TRAIN_SANDBOX_MAX_JOB_COUNT:-100000}
CLUSTER_NAME=htsandbox

INSTALL_HINT="run: bash $(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/install-deps.sh"
CTL_IP=$NET.1
HOST=$(hostname -s 2>/dev/null || hostname)
BR=${PFX}br0
CONF=$LAB/etc/slurm.conf
SOCK=$LAB/munge/munge.socket.2
export SLURM_CONF=$CONF
# keep the daemons' environment small and predictable
unset SLURM_JOB_ID SLURM_JOBID SLURM_STEP_ID 2>/dev/null || true

log() { echo "[sandbox.sh $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
node_ip() { echo "$NET.$((10 + $1))"; }
now() { date +%s.%N; }
elapsed() { echo "$(now) $1" | awk '{printf "%.1f", $1 - $2}'; }

# alive PIDFILE COMM -> true if the pid in PIDFILE runs a live (non-zombie) process named COMM
alive() {
  local f=$1 comm=$2 pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] &&
    [ "$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

# wait_until TIMEOUT_S DESCRIPTION CMD... : poll every 0.2 s
wait_until() {
  local t=$1 what=$2; shift 2
  local end=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out after ${t}s waiting for $what (logs: $LAB/log)"
    sleep 0.2
  done
}

# wait_gone TIMEOUT_S PID... : true once none of the pids exists
wait_gone() {
  local t=$1; shift
  local i pid any
  for i in $(seq 1 $((t * 10))); do
    any=0; for pid in "$@"; do [ -d "/proc/$pid" ] && any=1; done
    [ $any = 0 ] && return 0
    sleep 0.1
  done
  return 1
}

# stop_pids PID... : SIGTERM, wait up to 10 s, then SIGKILL
stop_pids() {
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  wait_gone 10 "$@" && return 0
  local pid
  for pid in "$@"; do
    [ -d "/proc/$pid" ] && { log "pid $pid ignored SIGTERM, sending SIGKILL"; kill -9 "$pid" 2>/dev/null || true; }
  done
  wait_gone 5 "$@" || log "WARNING: could not kill: $*"
}

# stop_group PIDFILE:COMM... : stop every live one
stop_group() {
  local spec f comm pids=()
  for spec in "$@"; do
    f=${spec%%:*}; comm=${spec##*:}
    if alive "$f" "$comm"; then
      pids+=("$(cat "$f")"); log "stopping $comm (pid $(cat "$f"))"
    fi
    rm -f "$f"
  done
  stop_pids "${pids[@]}"
}

# strays COMM... : pids of processes named COMM whose command line or environment points into
# $LAB and that no live pid file tracks (e.g. daemons of an earlier run whose pid files were lost)
strays() {
  local p pid comm tracked=" " spec
  for spec in $(all_daemons); do
    alive "${spec%%:*}" "${spec##*:}" && tracked="$tracked$(cat "${spec%%:*}") "
  done
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    comm=$(cat "$p/comm" 2>/dev/null) || continue
    case " $* " in *" $comm "*) ;; *) continue ;; esac
    case $tracked in *" $pid "*) continue ;; esac
    if tr '\0' '\n' 2>/dev/null < "$p/cmdline" | grep -qF -- "$LAB/" ||
       tr '\0' '\n' 2>/dev/null < "$p/environ" | grep -qxF -- "SLURM_CONF=$CONF"; then
      echo "$pid"
    fi
  done
}

check_tools() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  local t
  for t in munged munge slurmctld slurmd sinfo scontrol squeue scancel srun sbatch ip nsenter unshare mknod awk; do
    command -v $t >/dev/null || die "$t not found ($INSTALL_HINT)"
  done
  if [ "$ACCT" = 1 ]; then
    for t in slurmdbd sacct sacctmgr mariadbd mariadb-install-db mariadb mariadb-admin; do
      command -v $t >/dev/null || die "$t not found ($INSTALL_HINT)"
    done
  fi
}

# install_if_changed TMPFILE FILE : replace FILE by TMPFILE if different; true if replaced
install_if_changed() {
  if [ -f "$2" ] && cmp -s "$1" "$2"; then rm -f "$1"; return 1; fi
  mv "$1" "$2"; return 0
}

write_configs() {
  mkdir -p "$LAB"/{etc,munge,state,spool,log,run,dev,jobs}
  chmod 755 "$LAB" "$LAB/munge" "$LAB/jobs"   # munged requires the socket dir to be world-executable
  local i gres_line="" gres_node="" acct
  # $LAB/local is a mount point: inside node i's mount namespace $LAB/nodelocal/n$i is
  # bind-mounted on it, so every node sees its own node-local directory at the same path.
  mkdir -p "$LAB/local"
  for i in $(seq 1 "$NODES"); do mkdir -p "$LAB/spool/n$i" "$LAB/nodelocal/n$i"; done

  if [ ! -s "$LAB/munge/munge.key" ]; then
    dd if=/dev/urandom of="$LAB/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 400 "$LAB/munge/munge.key"

  # fake GPUs: gres/gpu needs character devices (regular files are rejected)
  if [ "$GPUS" -gt 0 ]; then
    for i in $(seq 0 $((GPUS - 1))); do
      [ -c "$LAB/dev/nvidia$i" ] || { rm -f "$LAB/dev/nvidia$i"; mknod "$LAB/dev/nvidia$i" c 195 "$i"; }
    done
    if [ "$GPUS" -eq 1 ]; then gres_line="Name=gpu File=$LAB/dev/nvidia0"
    else gres_line="Name=gpu File=$LAB/dev/nvidia[0-$((GPUS - 1))]"; fi
    gres_node=" Gres=gpu:$GPUS"
  fi
  echo "$gres_line" > "$LAB/etc/gres.conf.tmp"
  install_if_changed "$LAB/etc/gres.conf.tmp" "$LAB/etc/gres.conf" || true

  { echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    echo "$CTL_IP $HOST slurmctl"
    for i in $(seq 1 "$NODES"); do echo "$(node_ip $i) n$i"; done
  } > "$LAB/etc/hosts.tmp"
  install_if_changed "$LAB/etc/hosts.tmp" "$LAB/etc/hosts" || true

  if [ "$ACCT" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$CTL_IP
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$SOCK
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux"
  else
    acct="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
  fi

  cat > "$CONF.tmp" <<EOF
# generated by tests/cluster/sandbox.sh - do not edit
ClusterName=$CLUSTER_NAME
SlurmctldHost=$HOST($CTL_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCK
CredType=cred/munge
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$LAB/state
SlurmdSpoolDir=$LAB/spool/%n
SlurmctldPidFile=$LAB/run/slurmctld.pid
SlurmdPidFile=$LAB/run/slurmd-%n.pid
SlurmctldLogFile=$LAB/log/slurmctld.log
SlurmdLogFile=$LAB/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=$TASK_PLUGIN
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
# Tuned for tests, whose jobs are small and short and wait on each other: a pending job is looked at
# every 2 s (the main loop, default 60 s; backfill, default 30 s), not when the next event happens to
# come, and a batch job starts without waiting to be batched with others. KillWait stays 5 s: the ranks'
# save on SIGTERM (an admin's requeue) must fit between SIGTERM and SIGKILL on a loaded 2-core machine.
KillWait=5
MinJobAge=$MIN_JOB_AGE
MaxArraySize=$MAX_ARRAY_SIZE
MaxJobCount=$MAX_JOB_COUNT
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2,sched_min_interval=100000
SlurmdParameters=config_overrides
$acct
JobCompType=jobcomp/none
GresTypes=gpu
EOF
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=n$i NodeAddr=$(node_ip $i) CPUs=$CPUS RealMemory=$MEM$gres_node State=UNKNOWN" >> "$CONF.tmp"
  done
  cat >> "$CONF.tmp" <<EOF
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=ALL Default=NO MaxTime=INFINITE State=UP
EOF
  if install_if_changed "$CONF.tmp" "$CONF" && alive "$LAB/run/slurmctld.pid" slurmctld; then
    log "WARNING: slurm.conf changed while the cluster runs; run 'sandbox.sh down' and 'up' to apply"
  fi

  if [ "$ACCT" = 1 ]; then
    ( umask 077; cat > "$LAB/etc/slurmdbd.conf.tmp" <<EOF
AuthType=auth/munge
AuthInfo=socket=$SOCK
DbdHost=$HOST
DbdAddr=$CTL_IP
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LAB/log/slurmdbd.log
PidFile=$LAB/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
EOF
    )
    install_if_changed "$LAB/etc/slurmdbd.conf.tmp" "$LAB/etc/slurmdbd.conf" || true
    chmod 600 "$LAB/etc/slurmdbd.conf"   # slurmdbd refuses a world-readable config
  fi
  # srun --mpi=pmix creates <base>/spmix_appdir_<uid>_<job>.<step> on every node; with a
  # shared /tmp the second node fails "File exists", so use the per-node directory.
  echo "PMIxCliTmpDirBase=$LAB/local" > "$LAB/etc/mpi.conf.tmp"
  install_if_changed "$LAB/etc/mpi.conf.tmp" "$LAB/etc/mpi.conf" || true
  # cgroup/v1 explicitly: slurmd initialises a cgroup plugin even though nothing here uses
  # cgroups (proctrack/linuxproc, task/none); autodetect fails without /sys/fs/cgroup and picks
  # cgroup/v2 on unified hosts, which wants a systemd scope per slurmd. The v1 plugin touches no
  # cgroup filesystem with these settings (verified with /sys/fs/cgroup hidden).
  echo "CgroupPlugin=cgroup/v1" > "$LAB/etc/cgroup.conf.tmp"
  install_if_changed "$LAB/etc/cgroup.conf.tmp" "$LAB/etc/cgroup.conf" || true
  echo "export SLURM_CONF=$CONF" > "$LAB/env.sh"
}

net_up() {
  local i ns veth other
  # refuse to shadow a network that something else on this machine already uses
  other=$(ip -o -4 addr show | awk -v net="$NET." -v br="$BR" 'index($4, net) == 1 && $2 != br {print $2}' | sort -u)
  [ -z "$other" ] || die "$NET.0/24 is already used by interface(s) $(echo $other); set HPC_TRAIN_SANDBOX_NET (and HPC_TRAIN_SANDBOX_PREFIX)"
  if ! ip link show "$BR" >/dev/null 2>&1; then
    ip link add "$BR" type bridge
  fi
  ip -4 addr show dev "$BR" | grep -qF " $CTL_IP/24 " || ip addr add "$CTL_IP/24" dev "$BR"
  ip link set "$BR" up
  for i in $(seq 1 "$NODES"); do
    ns=${PFX}n$i; veth=${PFX}veth$i
    [ -e "/run/netns/$ns" ] || ip netns add "$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
      ip link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$veth" master "$BR"
    ip link set "$veth" up
    ip -n "$ns" -4 addr show dev eth0 | grep -qF " $(node_ip $i)/24 " || ip -n "$ns" addr add "$(node_ip $i)/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
  fw_up
}

# With br_netfilter loaded (e.g. by Docker, whose FORWARD policy is DROP), bridged node-to-node
# traffic passes iptables FORWARD: accept it for our bridge, and undo that in net_down.
fw_rule=(FORWARD -i "$BR" -o "$BR" -j ACCEPT -m comment --comment hpc_train-sandbox)
fw_up() {
  [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0)" = 1 ] || return 0
  if ! command -v iptables >/dev/null; then
    log "WARNING: br_netfilter is active but iptables is missing; node-to-node traffic may be dropped"
    return 0
  fi
  iptables -C "${fw_rule[@]}" 2>/dev/null || iptables -I "${fw_rule[@]}" ||
    log "WARNING: could not add an iptables FORWARD rule for $BR"
}
fw_down() {
  command -v iptables >/dev/null || return 0
  while iptables -C "${fw_rule[@]}" 2>/dev/null; do iptables -D "${fw_rule[@]}" || break; done
}

net_down() {
  fw_down
  local i ns
  for i in $(seq 1 "$NODES"); do
    ns=${PFX}n$i
    if [ -e "/run/netns/$ns" ]; then ip netns del "$ns" || log "WARNING: ip netns del $ns failed"; fi
    ip link del "${PFX}veth$i" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
}

start_munge() {
  if alive "$LAB/munge/munged.pid" munged && munge -n -S "$SOCK" >/dev/null 2>&1; then return 0; fi
  stop_group "$LAB/munge/munged.pid:munged"
  munged --socket="$SOCK" --key-file="$LAB/munge/munge.key" --pid-file="$LAB/munge/munged.pid" \
         --log-file="$LAB/log/munged.log" --seed-file="$LAB/munge/munged.seed" --num-threads=4 --force
  wait_until 10 munged munge -n -S "$SOCK"
  log "munged up (pid $(cat "$LAB/munge/munged.pid"))"
}

db_ping() { mariadb-admin --socket="$LAB/mysql/mysqld.sock" -uroot ping; }

start_db() {
  local M=$LAB/mysql
  mkdir -p "$M"
  if [ ! -d "$M/data/mysql" ]; then
    rm -rf "$M/data"
    mariadb-install-db --user=root --datadir="$M/data" --auth-root-authentication-method=normal \
                       --skip-test-db > "$LAB/log/mariadb-install.log" 2>&1 ||
      die "mariadb-install-db failed, see $LAB/log/mariadb-install.log"
  fi
  if ! alive "$M/mariadbd.pid" mariadbd; then
    rm -f "$M/mariadbd.pid"
    nohup mariadbd --user=root --datadir="$M/data" --socket="$M/mysqld.sock" --port="$DB_PORT" \
      --bind-address=127.0.0.1 --pid-file="$M/mariadbd.pid" --log-error="$LAB/log/mariadbd.err" \
      --skip-name-resolve --innodb-buffer-pool-size=64M > /dev/null 2>&1 < /dev/null &
    wait_until 60 mariadbd db_ping
    log "mariadbd up (pid $(cat "$M/mariadbd.pid"))"
    mariadb --socket="$M/mysqld.sock" -uroot -e "
      CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
      CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  fi
}

dbd_ping() { (exec 3<>"/dev/tcp/$CTL_IP/$DBD_PORT"); }

start_dbd() {
  alive "$LAB/run/slurmdbd.pid" slurmdbd && return 0
  slurmdbd   # reads slurmdbd.conf next to $SLURM_CONF
  wait_until 60 slurmdbd dbd_ping
  log "slurmdbd up (pid $(cat "$LAB/run/slurmdbd.pid"))"
}

start_ctld() {
  alive "$LAB/run/slurmctld.pid" slurmctld && return 0
  slurmctld -f "$CONF"
  wait_until 60 slurmctld timeout 5 scontrol ping
  log "slurmctld up (pid $(cat "$LAB/run/slurmctld.pid"))"
}

cluster_registered() { timeout 5 sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME"; }

start_slurmd() {
  local i=$1
  alive "$LAB/run/slurmd-n$i.pid" slurmd && return 0
  # nsenter (not 'ip netns exec'): ip netns exec remounts /sys without /sys/fs/cgroup,
  # and slurmd 22.05 then fails "Unable to initialize cgroup plugin".
  nsenter --net="/run/netns/${PFX}n$i" \
    unshare --uts --mount --propagation private \
    sh -c "hostname n$i && mount --bind '$LAB/etc/hosts' /etc/hosts &&
           mount --bind '$LAB/nodelocal/n$i' '$LAB/local' && exec slurmd -f '$CONF'" ||
    die "slurmd n$i failed to start, see $LAB/log/slurmd-n$i.log"
  wait_until 20 "slurmd n$i" alive "$LAB/run/slurmd-n$i.pid" slurmd
  log "slurmd n$i up (pid $(cat "$LAB/run/slurmd-n$i.pid"), $(node_ip $i))"
}

# nodes_ready: every node answers and is usable - idle on a fresh cluster; allocated/mixed
# when an idempotent 'up' finds jobs running
nodes_ready() {
  local out
  out=$(timeout 5 sinfo -h -N -p cpu -o '%N %T') || return 1
  [ "$(echo "$out" | grep -cE ' (idle|allocated|mixed|completing)$')" -eq "$NODES" ]
}

all_daemons() {
  local f
  echo "$LAB/munge/munged.pid:munged"
  if [ "$ACCT" = 1 ]; then echo "$LAB/mysql/mariadbd.pid:mariadbd"; echo "$LAB/run/slurmdbd.pid:slurmdbd"; fi
  echo "$LAB/run/slurmctld.pid:slurmctld"
  for i in $(seq 1 "$NODES"); do echo "$LAB/run/slurmd-n$i.pid:slurmd"; done
}

cmd_up() {
  check_tools
  local t0 i s
  t0=$(now)
  # daemons of an earlier run whose pid files are gone would hold the ports: stop them first
  s=$(strays munged mariadbd slurmdbd slurmctld slurmd)
  if [ -n "$s" ]; then log "stopping stray sandbox daemons: $(echo $s)"; stop_pids $s; fi
  write_configs
  net_up
  start_munge
  if [ "$ACCT" = 1 ]; then start_db; start_dbd; fi
  start_ctld
  if [ "$ACCT" = 1 ]; then wait_until 30 "cluster registration in slurmdbd" cluster_registered; fi
  for i in $(seq 1 "$NODES"); do start_slurmd "$i"; done
  # nodes left down/drained by an earlier run
  for i in $(seq 1 "$NODES"); do
    if timeout 5 sinfo -h -n "n$i" -o '%T' 2>/dev/null | grep -qE 'down|drain|fail'; then
      timeout 10 scontrol update NodeName="n$i" State=RESUME || true
    fi
  done
  wait_until 60 "all $NODES nodes to be idle" nodes_ready
  log "cluster up in $(elapsed "$t0") s (accounting=$ACCT, dir=$LAB)"
  timeout 5 sinfo -N -o '%N %P %T %c %m %G' >&2 || true
  echo "export SLURM_CONF=$CONF"
}

cmd_down() {
  local t0 i jobs ns left s
  t0=$(now)
  if alive "$LAB/run/slurmctld.pid" slurmctld; then
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      log "cancelling jobs: $(echo $jobs)"
      timeout 10 scancel $jobs || true
      for i in $(seq 1 100); do
        [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
  fi
  stop_group $(for i in $(seq 1 "$NODES"); do echo "$LAB/run/slurmd-n$i.pid:slurmd"; done) \
             "$LAB/run/slurmctld.pid:slurmctld"
  # anything still running in a node namespace (slurmstepd, job tasks) was started by this cluster
  for i in $(seq 1 "$NODES"); do
    ns=${PFX}n$i
    [ -e "/run/netns/$ns" ] || continue
    left=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$left" ]; then
      log "killing leftover processes in $ns: $(echo $left)"
      kill -9 $left 2>/dev/null || true
      wait_gone 5 $left || log "WARNING: still alive in $ns: $(echo $left)"
    fi
  done
  stop_group "$LAB/run/slurmdbd.pid:slurmdbd"
  stop_group "$LAB/mysql/mariadbd.pid:mariadbd" "$LAB/munge/munged.pid:munged"
  s=$(strays munged mariadbd slurmdbd slurmctld slurmd slurmstepd)
  if [ -n "$s" ]; then log "stopping stray sandbox processes: $(echo $s)"; stop_pids $s; fi
  net_down
  log "cluster down in $(elapsed "$t0") s"
}

cmd_status() {
  local spec f comm ok=0
  for spec in $(all_daemons); do
    f=${spec%%:*}; comm=${spec##*:}
    if alive "$f" "$comm"; then echo "$comm $(basename "$f") running pid $(cat "$f")"
    else echo "$comm $(basename "$f") not running"; ok=3; fi
  done
  if ! timeout 5 sinfo -N -o '%N %P %T %c %m %G' 2>/dev/null; then
    echo "sinfo: no answer from slurmctld"; ok=3
  fi
  echo "export SLURM_CONF=$CONF"
  return $ok
}

cmd_reset() {
  cmd_down
  case $LAB in /|/tmp|/tmp/|/root|/home|"") die "refusing to delete $LAB" ;; esac
  if [ -e "$LAB" ] && [ ! -e "$LAB/etc/slurm.conf" ] && [ -n "$(ls -A "$LAB" 2>/dev/null)" ]; then
    die "$LAB does not look like a sandbox directory (no etc/slurm.conf); not deleting it"
  fi
  rm -rf "$LAB"
  log "state removed ($LAB)"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  reset) cmd_reset ;;
  *) echo "usage: $0 up|down|status|env|reset" >&2; exit 2 ;;
esac

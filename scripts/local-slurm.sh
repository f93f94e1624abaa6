#!/usr/bin/env bash
# local-slurm.sh - run a real, throw-away Slurm cluster on this one machine.
#
# Uses the distribution packages (Debian/Ubuntu: slurm-wlm, munge). Everything
# the cluster needs (munge key/socket, slurm.conf, state, spool, logs, pid
# files) lives under a directory chosen by the caller, so nothing global is
# touched apart from installing the packages.
#
# Usage (as root; run by a user, it goes through sudo itself):
#   scripts/local-slurm.sh install       # apt-get install slurm-wlm munge if missing
#   scripts/local-slurm.sh start DIR     # start munged, slurmctld, slurmd x2 (node1, node2)
#   source DIR/env.sh                    # exports SLURM_CONF (+ helpers) for clients
#   srun -N2 -n4 hostname
#   scripts/local-slurm.sh stop DIR      # stop everything started from DIR
#   scripts/local-slurm.sh status DIR    # sinfo/squeue of the cluster in DIR
#
# Cluster layout: one partition "debug" (Default=YES; the name is
# $LOCAL_SLURM_PARTITION, its time limit $LOCAL_SLURM_MAXTIME, enforced at
# submission: EnforcePartLimits=ALL) with nodes node1 and node2, each
# CPUs=$LOCAL_SLURM_CPUS (default 2) and RealMemory=$LOCAL_SLURM_MEM MB (a job
# asking --mem for more is refused), both reached at 127.0.0.1 on different
# ports. With LOCAL_SLURM_GPUS=N each node also offers N "gpu" GRES backed by
# stand-in devices (DIR/dev/gpuK, copies of /dev/null), so scripts asking for
# --gres=gpu:N are scheduled as on a GPU cluster, and Slurm sets
# CUDA_VISIBLE_DEVICES in each step as it does there: every GPU of the job with
# --gres=gpu:N, one per task with --gpus-per-task=1 (there is no GPU behind
# them: run the CPU backend).
#
# Closer to Leonardo (what would be refused there is refused here):
# - QOS: a job_submit.lua (DIR/job_submit.lua) knows the QOS of
#   $LOCAL_SLURM_QOS ("name:max_nodes:max_minutes ..."; default: none, any QOS
#   is accepted as Slurm without accounting does) and refuses an unknown QOS,
#   or more nodes or time than the QOS allows, at submission.
# - accounts: with $LOCAL_SLURM_ACCOUNTS ("name ..."), the same job_submit.lua
#   refuses a job that names any other account (--account, SBATCH_ACCOUNT), as
#   Slurm with accounting does; a job naming none is accepted.
# - modules: DIR/bin/module (on PATH after `source DIR/env.sh`) stands in for
#   the site's `module`: `module load NAME...` succeeds only for the names in
#   $LOCAL_SLURM_MODULES (default "cuda nccl") and fails as Lmod does otherwise.
# - reservations: `scontrol create reservation ...` works as usual; jobs given
#   --reservation (or SBATCH_RESERVATION) that names none are refused.
#
# Node names: a job's programs find rank 0 at the first host of
# SLURM_JOB_NODELIST, so node1 and node2 must resolve. If they do not, start
# adds "127.0.0.1 node1 node2" to /etc/hosts (marked with DIR), and stop
# removes exactly the line it added.
#
# Across the nodes of a cluster in a box (scripts/cluster.sh): with LOCAL_SLURM_BOX=1, start
# runs slurmctld on node0 and a slurmd on every node of the box that is up (node0, node1, ...
# at 10.0.0.1, ...; each in its node's namespace, so a job's tasks run there), all on port
# $LOCAL_SLURM_NODE1_PORT of their own address; this machine (10.0.0.254) is the login node that
# sbatch, salloc and srun run on. The box must be up first.
#
# Environment overrides (all optional):
#   LOCAL_SLURM_CTLD_PORT   slurmctld port            (default 26817)
#   LOCAL_SLURM_NODE1_PORT  slurmd port of node1      (default 26818)
#   LOCAL_SLURM_NODE2_PORT  slurmd port of node2      (default 26819)
#   LOCAL_SLURM_CPUS        CPUs advertised per node  (default 2)
#   LOCAL_SLURM_TIMEOUT     seconds to wait for start/stop steps (default 60)
#   LOCAL_SLURM_CLUSTER     ClusterName               (default localslurm)
#   LOCAL_SLURM_PARTITION   partition name            (default debug)
#   LOCAL_SLURM_GPUS        fake "gpu" GRES per node  (default 0: none)
#   LOCAL_SLURM_HOSTS_FILE  where node names are added (default /etc/hosts)
#   LOCAL_SLURM_MAXTIME     the partition's MaxTime   (default INFINITE)
#   LOCAL_SLURM_MEM         RealMemory per node, MB   (default 1000)
#   LOCAL_SLURM_QOS         QOS and their limits      (default: none enforced;
#                           max_minutes 0: the partition's limit only)
#   LOCAL_SLURM_MODULES     names `module load` knows (default "cuda nccl")
#   LOCAL_SLURM_ACCOUNTS    accounts a job may name   (default: any)

set -euo pipefail

PROG=${0##*/}
ARGS=("$@")
# In a cluster in a box the nodes are shaped like Leonardo's Booster unless told otherwise (the
# course's sbatch scripts ask for its partition, QOS, GPUs and memory): 32 CPUs, 4 stand-in GPUs
# and 494 GB per node, partition boost_usr_prod (24 h), QOS normal and boost_qos_dbg.
if [[ ${LOCAL_SLURM_BOX:-0} == 1 ]]; then
    : "${LOCAL_SLURM_CPUS:=32}" "${LOCAL_SLURM_GPUS:=4}" "${LOCAL_SLURM_MEM:=494000}"
    : "${LOCAL_SLURM_PARTITION:=boost_usr_prod}" "${LOCAL_SLURM_MAXTIME:=24:00:00}"
    : "${LOCAL_SLURM_QOS:=normal:64:0 boost_qos_dbg:2:30}"
fi
CTLD_PORT=${LOCAL_SLURM_CTLD_PORT:-26817}
NODE1_PORT=${LOCAL_SLURM_NODE1_PORT:-26818}
NODE2_PORT=${LOCAL_SLURM_NODE2_PORT:-26819}
NODE_CPUS=${LOCAL_SLURM_CPUS:-2}
TIMEOUT=${LOCAL_SLURM_TIMEOUT:-60}
CLUSTER=${LOCAL_SLURM_CLUSTER:-localslurm}
PARTITION=${LOCAL_SLURM_PARTITION:-debug}
GPUS=${LOCAL_SLURM_GPUS:-0}
HOSTS_FILE=${LOCAL_SLURM_HOSTS_FILE:-/etc/hosts}
MAXTIME=${LOCAL_SLURM_MAXTIME:-INFINITE}
NODE_MEM=${LOCAL_SLURM_MEM:-1000}
QOS_LIMITS=${LOCAL_SLURM_QOS:-}
MODULES_KNOWN=${LOCAL_SLURM_MODULES:-cuda nccl}
ACCOUNTS=${LOCAL_SLURM_ACCOUNTS:-}
NODES=(node1 node2)
# The cluster in a box (scripts/cluster.sh), when LOCAL_SLURM_BOX=1: its nodes and addresses.
BOX=${LOCAL_SLURM_BOX:-0}
BOX_STATE=/run/nccl-workshop-cluster
CLUSTER_SH="$(cd "$(dirname "$0")" && pwd)/cluster.sh"
if [[ $BOX == 1 && ${1:-} == start ]]; then
    if [[ ! -f $BOX_STATE/nodes ]]; then
        printf '%s: ERROR: LOCAL_SLURM_BOX=1 but no cluster in a box is up: run scripts/cluster.sh up --nodes 2 first\n' "${0##*/}" >&2
        exit 1
    fi
fi
if [[ $BOX == 1 && -f $BOX_STATE/nodes ]]; then
    NODES=()
    for ((k = 0; k < $(cat "$BOX_STATE/nodes"); k++)); do NODES+=("node$k"); done
fi
# Marker put into the environment of every daemon we start (inherited by
# slurmstepd), so that `stop` can find stragglers belonging to this DIR only.
MARKER_VAR=LOCAL_SLURM_INSTANCE
# daemons live in /usr/sbin, which is not always on PATH for non-login shells
export PATH="$PATH:/usr/sbin:/sbin"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
    sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}

# Root is needed (slurmd/slurmctld run with SlurmUser=root): run by a user, the script starts
# itself again through sudo, keeping the environment (LOCAL_SLURM_*) and PATH.
need_root() {
    [[ $(id -u) -eq 0 ]] && return 0
    command -v sudo >/dev/null 2>&1 ||
        die "must run as root (slurmd/slurmctld are run with SlurmUser=root), and there is no sudo here: run it as root"
    exec sudo -E env PATH="$PATH" bash "$0" "${ARGS[@]}"
}

# ---------------------------------------------------------------- install ---

have_binaries() {
    local b
    for b in slurmctld slurmd munged sinfo srun sbatch squeue scontrol; do
        command -v "$b" >/dev/null 2>&1 || return 1
    done
}

cmd_install() {
    if have_binaries; then
        log "slurm and munge already installed ($(slurmctld -V 2>/dev/null || echo '?'))"
        return 0
    fi
    need_root
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install slurm-wlm and munge manually"
    export DEBIAN_FRONTEND=noninteractive
    # Keep the packages' maintainer scripts from starting the system-wide
    # daemons (they would use the default ports / sockets). Only if no policy
    # is in place already; removed again afterwards.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
    fi
    local rc=0 aptlog
    aptlog=$(mktemp)
    {
        apt-get update -qq &&
            apt-get install -y -qq --no-install-recommends \
                -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
                slurm-wlm munge
    } >"$aptlog" 2>&1 || rc=$?
    [[ $made_policy -eq 1 ]] && rm -f "$policy"
    if [[ $rc -ne 0 ]]; then
        tail -n 40 "$aptlog" >&2
        rm -f "$aptlog"
        die "apt-get failed (exit $rc)"
    fi
    rm -f "$aptlog"
    have_binaries || die "packages installed but slurm/munge binaries still missing"
    log "installed $(slurmctld -V 2>/dev/null || echo slurm)"
}

# ------------------------------------------------------------------ utils ---

# absolute path of DIR (created if needed)
abs_dir() {
    mkdir -p "$1"
    (cd "$1" && pwd -P)
}

# running and not a zombie (PID 1 in containers may be slow to reap orphans)
pid_alive() {
    [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null || return 1
    local stat=""
    read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

read_pid() {
    local f=$1 p=""
    if [[ -r $f ]]; then read -r p <"$f" 2>/dev/null || true; fi
    [[ $p =~ ^[0-9]+$ ]] && echo "$p"
    return 0
}

# on NODE PROGRAM ARG...: PROGRAM on that node of the box (LOCAL_SLURM_BOX=1), else here.
on() {
    local node=$1
    shift
    if [[ $BOX == 1 ]]; then "$CLUSTER_SH" exec "$node" "$@"; else "$@"; fi
}

# port_listening NODE PORT: port_in_use as seen on NODE (its own network namespace in the box).
port_listening() {
    if [[ $BOX == 1 ]]; then
        ip netns exec "nw-$1" bash -c "$(declare -f port_in_use); port_in_use $2"
    else
        port_in_use "$2"
    fi
}

port_in_use() {
    # true if some socket listens on TCP port $1 (any address). Reads
    # /proc/net/tcp* rather than connecting, so no noise in daemon logs.
    local hex
    hex=$(printf '%04X' "$1")
    if [[ -r /proc/net/tcp ]]; then
        grep -qE "^ *[0-9]+: [0-9A-F]+:$hex [0-9A-F]+:[0-9A-F]+ 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    fi
}

show_logs() {
    local d=$1 f
    for f in "$d"/log/*.log; do
        [[ -f $f ]] || continue
        echo "----- tail of $f -----" >&2
        tail -n 25 "$f" >&2
    done
}

fail_start() {
    local d=$1
    shift
    log "ERROR: $*"
    show_logs "$d"
    log "stopping what was started"
    cmd_stop "$d" >/dev/null 2>&1 || true
    exit 1
}

# pids (one per line) of processes carrying our marker for $1
marked_pids() {
    local want="$MARKER_VAR=$1" e pid
    for e in /proc/[0-9]*/environ; do
        pid=${e#/proc/}
        pid=${pid%/environ}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        if grep -qzxF -- "$want" "$e" 2>/dev/null; then
            echo "$pid"
        fi
    done
}

# all descendants of the given pids (not including them)
descendants() {
    [[ $# -gt 0 ]] || return 0
    local -A kids=()
    local st pid rest ppid
    for st in /proc/[0-9]*/stat; do
        read -r rest 2>/dev/null <"$st" || continue
        pid=${rest%% *}
        rest=${rest##*) }          # after "(comm) ": state ppid ...
        read -r _ ppid _ <<<"$rest"
        kids[$ppid]+="$pid "
    done
    local queue=("$@") p c
    while [[ ${#queue[@]} -gt 0 ]]; do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        for c in ${kids[$p]:-}; do
            echo "$c"
            queue+=("$c")
        done
    done
}

# send TERM, wait up to $1 seconds, then KILL; remaining args are pids
terminate() {
    local wait_s=$1
    shift
    local pids=() p
    for p in "$@"; do pid_alive "$p" && pids+=("$p"); done
    [[ ${#pids[@]} -gt 0 ]] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + wait_s)) alive
    while :; do
        alive=()
        for p in "${pids[@]}"; do pid_alive "$p" && alive+=("$p"); done
        [[ ${#alive[@]} -eq 0 ]] && return 0
        [[ $SECONDS -ge $deadline ]] && break
        sleep 0.2
    done
    log "killing unresponsive processes: ${alive[*]}"
    kill -KILL "${alive[@]}" 2>/dev/null || true
    sleep 0.2
}

# ------------------------------------------------------------ node names ---

# The /etc/hosts line this cluster adds: tagged with DIR so stop removes only it.
hosts_tag() { echo "# added by local-slurm.sh for $1"; }

# Makes node1 and node2 resolvable (to 127.0.0.1) if they are not already.
add_host_names() {
    local d=$1 n missing=()
    for n in "${NODES[@]}"; do
        getent hosts "$n" >/dev/null 2>&1 || missing+=("$n")
    done
    [[ ${#missing[@]} -gt 0 ]] || return 0
    if ! printf '127.0.0.1 %s %s\n' "${missing[*]}" "$(hosts_tag "$d")" >>"$HOSTS_FILE" 2>/dev/null; then
        log "WARNING: cannot add ${missing[*]} to $HOSTS_FILE: programs that look up a node name will fail"
        return 0
    fi
    log "added '127.0.0.1 ${missing[*]}' to $HOSTS_FILE (removed again by stop)"
}

remove_host_names() {
    local d=$1 tag
    tag=$(hosts_tag "$d")
    [[ -w $HOSTS_FILE ]] && grep -qF -- "$tag" "$HOSTS_FILE" 2>/dev/null || return 0
    # Rewrite in place (not a rename: /etc/hosts may be a bind mount).
    local kept
    kept=$(grep -vF -- "$tag" "$HOSTS_FILE" || true)
    printf '%s\n' "$kept" >"$HOSTS_FILE"
}

# ------------------------------------------------------------------ start ---

write_conf() {
    local d=$1
    local gres_types="" node_gres=""
    if [[ $GPUS -gt 0 ]]; then
        gres_types="GresTypes=gpu"
        node_gres="Gres=gpu:$GPUS"
        mkdir -p "$d/dev"
        local i
        # One character device per "GPU", each a copy of /dev/null (1:3): slurmd binds only
        # devices, and only then sets CUDA_VISIBLE_DEVICES in each step (the index it puts there
        # is the number in the file's name). Where mknod is not allowed, plain files: the GRES are
        # still scheduled, but steps get no CUDA_VISIBLE_DEVICES.
        for ((i = 0; i < GPUS; i++)); do
            mknod -m 0666 "$d/dev/gpu$i" c 1 3 2>/dev/null || : >"$d/dev/gpu$i"
        done
        echo "Name=gpu File=$d/dev/gpu[0-$((GPUS - 1))]" >"$d/gres.conf"
    fi
    local job_submit=""
    if [[ -n $QOS_LIMITS || -n $ACCOUNTS ]]; then
        job_submit="JobSubmitPlugins=lua"
        write_job_submit_lua "$d"
    fi
    local ctld_host="localhost(127.0.0.1)" node_lines n k
    node_lines="NodeName=node1 NodeAddr=127.0.0.1 NodeHostname=localhost Port=$NODE1_PORT CPUs=$NODE_CPUS RealMemory=$NODE_MEM $node_gres State=UNKNOWN
NodeName=node2 NodeAddr=127.0.0.1 NodeHostname=localhost Port=$NODE2_PORT CPUs=$NODE_CPUS RealMemory=$NODE_MEM $node_gres State=UNKNOWN"
    if [[ $BOX == 1 ]]; then
        ctld_host="node0(10.0.0.1)"
        node_lines=""
        for k in "${!NODES[@]}"; do
            n=${NODES[$k]}
            node_lines+="NodeName=$n NodeAddr=10.0.0.$((k + 1)) NodeHostname=$n Port=$NODE1_PORT CPUs=$NODE_CPUS RealMemory=$NODE_MEM $node_gres State=UNKNOWN
"
        done
    fi
    local node_list
    node_list=$(IFS=,; echo "${NODES[*]}")
    cat >"$d/slurm.conf" <<EOF
# Generated by $PROG for a throw-away local test cluster.
ClusterName=$CLUSTER
SlurmctldHost=$ctld_host
SlurmctldPort=$CTLD_PORT
SlurmdPort=$NODE1_PORT
SlurmUser=root
SlurmdUser=root

AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.socket
CommunicationParameters=NoAddrCache

StateSaveLocation=$d/state
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdSpoolDir=$d/spool/%n
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmdLogFile=$d/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info

ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# start batch jobs right away (default delays batch scheduling by up to 3 s)
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
MailProg=/bin/true
# a job over the partition's limits is refused at submission, not left pending
EnforcePartLimits=ALL
$job_submit
$gres_types

ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0

$node_lines
PartitionName=$PARTITION Nodes=$node_list Default=YES MaxTime=$MAXTIME State=UP OverSubscribe=NO
EOF
}

# The QOS a job may name, with their limits, and the accounts it may name, checked when a job is
# submitted (Slurm without accounting, as here, takes any --qos and --account as given and
# enforces nothing).
write_job_submit_lua() {
    local d=$1 q name nodes minutes table="" accounts="" a
    for a in $ACCOUNTS; do
        [[ $a =~ ^[A-Za-z0-9_.-]+$ ]] || die "LOCAL_SLURM_ACCOUNTS: '$a' is not an account name"
        accounts+="    [\"$a\"] = true,"$'\n'
    done
    for q in $QOS_LIMITS; do
        IFS=: read -r name nodes minutes <<<"$q"
        [[ $name =~ ^[A-Za-z0-9_.-]+$ && $nodes =~ ^[0-9]+$ && $minutes =~ ^[0-9]+$ ]] ||
            die "LOCAL_SLURM_QOS: '$q' is not name:max_nodes:max_minutes"
        table+="    [\"$name\"] = { nodes = $nodes, minutes = $minutes },"$'\n'
    done
    cat >"$d/job_submit.lua" <<EOF
-- Generated by $PROG: the QOS of this cluster and their per-job limits (LOCAL_SLURM_QOS).
local qos_limits = {
$table}
local qos_enforced = $([[ -n $QOS_LIMITS ]] && echo true || echo false)
-- The accounts a job may name (LOCAL_SLURM_ACCOUNTS; none listed: any).
local accounts = {
$accounts}
local accounts_enforced = $([[ -n $ACCOUNTS ]] && echo true || echo false)

local function given(v)
    return v ~= nil and v ~= slurm.NO_VAL and v ~= slurm.NO_VAL16 and v ~= 0
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local account = job_desc.account
    if accounts_enforced and account ~= nil and account ~= "" and not accounts[account] then
        slurm.log_user("Invalid account or account/partition combination specified: %s", account)
        return slurm.ERROR
    end
    local qos = job_desc.qos
    if not qos_enforced or qos == nil or qos == "" then
        return slurm.SUCCESS
    end
    local limit = qos_limits[qos]
    if limit == nil then
        local names = {}
        for name, _ in pairs(qos_limits) do table.insert(names, name) end
        table.sort(names)
        slurm.log_user("Invalid qos specification: %s (this cluster has %s)", qos, table.concat(names, ", "))
        return slurm.ERROR
    end
    if given(job_desc.min_nodes) and job_desc.min_nodes > limit.nodes then
        slurm.log_user("QOSMaxNodePerJobLimit: QOS %s allows %d node(s) per job, the job asks for %d",
            qos, limit.nodes, job_desc.min_nodes)
        return slurm.ERROR
    end
    if limit.minutes > 0 and given(job_desc.time_limit) and job_desc.time_limit > limit.minutes then
        slurm.log_user("QOSMaxWallDurationPerJobLimit: QOS %s allows %d minutes per job, the job asks for %d",
            qos, limit.minutes, job_desc.time_limit)
        return slurm.ERROR
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end
EOF
}

# A stand-in for the site's `module` (Lmod on Leonardo): `load` knows only MODULES_KNOWN and
# fails, as Lmod does, on any other name; it changes nothing else (there is nothing to load).
write_module_stand_in() {
    local d=$1
    mkdir -p "$d/bin"
    cat >"$d/bin/module" <<EOF
#!/bin/bash
# Generated by $PROG: stands in for the site's module command; it knows: $MODULES_KNOWN
known=" $MODULES_KNOWN "
sub=\${1:-}
shift || true
case \$sub in
load | add)
    unknown=()
    for m in "\$@"; do [[ \$known == *" \$m "* ]] || unknown+=("\"\$m\""); done
    if [[ \${#unknown[@]} -gt 0 ]]; then
        echo "Lmod has detected the following error: The following module(s) are unknown: \${unknown[*]}" >&2
        exit 1
    fi
    ;;
avail | spider) printf '%s\n' \$known ;;
list | purge | unload | use) ;;
*) echo "module (stand-in): \$sub: not supported here" >&2; exit 1 ;;
esac
EOF
    chmod 755 "$d/bin/module"
}

cmd_start() {
    need_root
    have_binaries || die "slurm/munge not installed; run '$0 install' first"
    local d
    d=$(abs_dir "$1")
    local t0=$SECONDS

    if pid_alive "$(read_pid "$d/run/slurmctld.pid")" || pid_alive "$(read_pid "$d/run/munged.pid")"; then
        die "a cluster seems to be running from $d already; run '$0 stop $d' first"
    fi
    local p
    if [[ $BOX == 1 ]]; then
        port_listening node0 "$CTLD_PORT" && die "TCP port $CTLD_PORT is already in use on node0 (override with LOCAL_SLURM_CTLD_PORT)"
        for p in "${NODES[@]}"; do
            port_listening "$p" "$NODE1_PORT" && die "TCP port $NODE1_PORT is already in use on $p (override with LOCAL_SLURM_NODE1_PORT)"
        done
    else
        for p in "$CTLD_PORT" "$NODE1_PORT" "$NODE2_PORT"; do
            port_in_use "$p" && die "TCP port $p is already in use (override with LOCAL_SLURM_*_PORT)"
        done
    fi
    [[ $d != *[[:space:]\'\"]* ]] || die "DIR must not contain spaces or quotes: $d"
    local sock="$d/munge/munge.socket"
    [[ ${#sock} -lt 100 ]] || die "DIR path too long for a unix socket ($sock); use a shorter DIR"

    # munged refuses group/world-writable socket and key directories.
    # (0755: lets non-root users reach the munge socket and config)
    chmod 0755 "$d"
    rm -rf "${d:?}/munge" "$d/state" "$d/spool" "$d/run" "$d/log" "${d:?}/dev" "$d/gres.conf" "${d:?}/bin" "$d/job_submit.lua"
    mkdir -p "$d/munge" "$d/state" "$d/run" "$d/log"
    for p in "${NODES[@]}"; do mkdir -p "$d/spool/$p"; done
    chmod 0755 "$d/munge"

    # run daemons with the marker in their environment
    local M=(env "$MARKER_VAR=$d")

    # --- munge
    dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none
    chmod 0600 "$d/munge/munge.key"
    "${M[@]}" munged --force \
        --socket="$sock" \
        --key-file="$d/munge/munge.key" \
        --pid-file="$d/run/munged.pid" \
        --log-file="$d/log/munged.log" \
        --seed-file="$d/munge/munged.seed" \
        >>"$d/log/munged.log" 2>&1 ||
        fail_start "$d" "munged failed to start"
    local deadline=$((SECONDS + TIMEOUT))
    until [[ -S $sock ]] && munge --socket="$sock" -n </dev/null 2>/dev/null | unmunge --socket="$sock" >/dev/null 2>&1; do
        [[ $SECONDS -lt $deadline ]] || fail_start "$d" "munged did not become ready within ${TIMEOUT}s"
        sleep 0.1
    done

    # --- slurm
    # In the box every node resolves the others' names already (scripts/cluster.sh).
    [[ $BOX == 1 ]] || add_host_names "$d"
    write_conf "$d"
    write_module_stand_in "$d"
    export SLURM_CONF="$d/slurm.conf"
    # -c: clean start (ignore saved state), -i: ignore errors in state files
    on node0 "${M[@]}" slurmctld -c -i -f "$SLURM_CONF" >>"$d/log/slurmctld.log" 2>&1 ||
        fail_start "$d" "slurmctld failed to start"
    deadline=$((SECONDS + TIMEOUT))
    until scontrol ping 2>/dev/null | grep -q 'is UP'; do
        [[ $SECONDS -lt $deadline ]] || fail_start "$d" "slurmctld did not answer within ${TIMEOUT}s"
        p=$(read_pid "$d/run/slurmctld.pid")
        [[ -z $p ]] || pid_alive "$p" || fail_start "$d" "slurmctld exited"
        sleep 0.2
    done

    for p in "${NODES[@]}"; do
        on "$p" "${M[@]}" slurmd -N "$p" -f "$SLURM_CONF" >>"$d/log/slurmd-$p.log" 2>&1 ||
            fail_start "$d" "slurmd for $p failed to start"
    done

    # wait until both slurmd are up (pid file, process, port) and sinfo shows
    # both nodes idle
    local states problem n i
    local ports=("$NODE1_PORT" "$NODE2_PORT")
    [[ $BOX == 0 ]] || for i in "${!NODES[@]}"; do ports[i]=$NODE1_PORT; done
    deadline=$((SECONDS + TIMEOUT))
    while :; do
        problem=""
        for i in "${!NODES[@]}"; do
            n=${NODES[$i]}
            p=$(read_pid "$d/run/slurmd-$n.pid")
            if [[ -z $p ]]; then
                problem="slurmd for $n has not written its pid file"
            elif ! pid_alive "$p"; then
                fail_start "$d" "slurmd for $n (pid $p) exited"
            elif ! port_listening "$n" "${ports[$i]}"; then
                problem="slurmd for $n not listening on port ${ports[$i]}"
            fi
            [[ -n $problem ]] && break
        done
        pid_alive "$(read_pid "$d/run/slurmctld.pid")" || fail_start "$d" "slurmctld exited"
        if [[ -z $problem ]]; then
            states=$(sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null | sort -u | tr '\n' ' ')
            [[ $states == "$(printf '%s idle ' "${NODES[@]}")" ]] && break
            problem="nodes not idle (sinfo: ${states:-no answer})"
        fi
        [[ $SECONDS -lt $deadline ]] || fail_start "$d" "cluster not ready within ${TIMEOUT}s: $problem"
        sleep 0.2
    done

    cat >"$d/env.sh" <<EOF
# source this file to talk to the local Slurm cluster in $d
export SLURM_CONF='$d/slurm.conf'
export LOCAL_SLURM_DIR='$d'
# the stand-in for the site's \`module\` (see $PROG)
export PATH='$d/bin':"\$PATH"
# munge socket of this cluster (for e.g. 'munge --socket=\$LOCAL_SLURM_MUNGE_SOCKET -n');
# Slurm itself reads it from AuthInfo in slurm.conf.
export LOCAL_SLURM_MUNGE_SOCKET='$sock'
EOF
    # In the box, srun and salloc on this machine are reached back by the nodes at the login
    # address, the only one of ours they can route to.
    [[ $BOX == 0 ]] || echo "export SLURM_SRUN_COMM_IFHN=10.0.0.254" >>"$d/env.sh"
    local ctld_at=127.0.0.1
    [[ $BOX == 0 ]] || ctld_at="node0 at 10.0.0.1"
    log "cluster up in $((SECONDS - t0))s: ${NODES[*]} idle in partition $PARTITION (slurmctld $ctld_at:$CTLD_PORT)"
    echo "$d/env.sh"
}

# ------------------------------------------------------------------- stop ---

cmd_stop() {
    local d
    [[ -d $1 ]] || { log "$1: no such directory, nothing to stop"; return 0; }
    d=$(cd "$1" && pwd -P)
    unset "$MARKER_VAR"
    local wait_s=$TIMEOUT
    [[ $wait_s -gt 20 ]] && wait_s=20

    # Cancel jobs first so slurmstepd/tasks are torn down cleanly.
    if [[ -f $d/slurm.conf ]] && pid_alive "$(read_pid "$d/run/slurmctld.pid")"; then
        SLURM_CONF="$d/slurm.conf" timeout 10 scancel --full --quiet -u root >/dev/null 2>&1 || true
        local deadline=$((SECONDS + 10))
        while [[ $SECONDS -lt $deadline ]] &&
            [[ -n $(SLURM_CONF="$d/slurm.conf" timeout 5 squeue -h -t R,CG,PD -o %i 2>/dev/null) ]]; do
            sleep 0.3
        done
    fi

    local pids=() p n
    for n in "${NODES[@]}"; do
        p=$(read_pid "$d/run/slurmd-$n.pid")
        [[ -n $p ]] && pids+=("$p")
    done
    p=$(read_pid "$d/run/slurmctld.pid")
    [[ -n $p ]] && pids+=("$p")
    [[ ${#pids[@]} -gt 0 ]] && terminate "$wait_s" "${pids[@]}"
    local reap=("${pids[@]}")

    # stragglers: anything started with our marker (e.g. slurmstepd) + children
    local left=()
    mapfile -t left < <(marked_pids "$d")
    p=$(read_pid "$d/run/munged.pid")
    # munge last: slurm daemons need it while shutting down
    local strag=()
    for n in "${left[@]}"; do [[ $n != "$p" ]] && strag+=("$n"); done
    if [[ ${#strag[@]} -gt 0 ]]; then
        local all=()
        mapfile -t all < <(descendants "${strag[@]}")
        terminate 5 "${strag[@]}" "${all[@]}"
        reap+=("${strag[@]}")
    fi
    if [[ -n $p ]]; then
        terminate "$wait_s" "$p"
        reap+=("$p")
    fi

    # final check
    mapfile -t left < <(marked_pids "$d")
    if [[ ${#left[@]} -gt 0 ]]; then
        kill -KILL "${left[@]}" 2>/dev/null || true
        sleep 0.3
        mapfile -t left < <(marked_pids "$d")
        [[ ${#left[@]} -eq 0 ]] || die "processes still running: ${left[*]}"
    fi
    # The daemons are children of PID 1 (they daemonize); give it a moment to
    # reap them so that no <defunct> entries show up in `pgrep` right after.
    local deadline=$((SECONDS + 5)) z
    while [[ ${#reap[@]} -gt 0 && $SECONDS -lt $deadline ]]; do
        z=()
        for n in "${reap[@]}"; do [[ -e /proc/$n ]] && z+=("$n"); done
        [[ ${#z[@]} -eq 0 ]] && break
        reap=("${z[@]}")
        sleep 0.1
    done
    rm -f "$d"/run/*.pid "$d/munge/munge.socket" "$d/munge/munge.socket.lock"
    remove_host_names "$d"
    log "cluster in $d stopped"
}

cmd_status() {
    local d
    d=$(cd "$1" && pwd -P)
    export SLURM_CONF="$d/slurm.conf"
    sinfo -N -l
    squeue
}

# ------------------------------------------------------------------- main ---

[[ $# -ge 1 ]] || usage
case $1 in
install) cmd_install ;;
start) [[ $# -eq 2 ]] || usage; cmd_start "$2" ;;
stop) [[ $# -eq 2 ]] || usage; need_root; cmd_stop "$2" ;;
status) [[ $# -eq 2 ]] || usage; cmd_status "$2" ;;
-h | --help | help) usage ;;
*) usage ;;
esac

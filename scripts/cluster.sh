#!/usr/bin/env bash
# cluster.sh - a cluster in a box: N "nodes" on this Linux machine, each a network namespace with
# its own host name (node0, node1, ...) and address (10.0.0.1, 10.0.0.2, ...), joined by a switch
# over links of a set speed, so that the course's multi-node commands run as written.
#
#   scripts/cluster.sh up --nodes 2 [--rate 2gbit]   # make the nodes and their links
#   scripts/cluster.sh exec node1 CMD [ARG...]       # run CMD on node1 (cwd and env kept)
#   scripts/cluster.sh status                        # what exists
#   scripts/cluster.sh picture FILE.svg              # draw the nodes and links
#   scripts/cluster.sh cut node1                     # cut node1's cable: its packets vanish
#   scripts/cluster.sh mend node1                    # plug it back in
#   scripts/cluster.sh rate node1 1mbit              # node1's outgoing link at another rate
#   scripts/cluster.sh down                          # remove everything, stop what runs there
#
# It needs root. Run by a user, it starts itself again through sudo, keeping the environment
# and PATH (a virtual environment's torchrun, for exec), so the same commands work for both.
#
# How it is built (Linux parts only, nothing installed):
# - node K: network namespace nw-nodeK; interface eth0 at 10.0.0.(K+1)/24, MTU 9000; lo up.
#   `exec` runs the command in that namespace and in a new UTS namespace named nodeK, so
#   `hostname` says nodeK and our programs see each node as a host of its own (shared memory
#   inside a node, TCP between nodes). The names node0... resolve inside every node (exec shows
#   /etc/netns/nw-nodeK/hosts as /etc/hosts, as ip netns exec does).
# - the switch: namespace nw-switch with bridge br0; every node's eth0 is one end of a veth pair
#   whose other end is a port of br0. A token bucket (tc tbf) on each node's eth0 gives the
#   node's outgoing link the rate RATE: traffic between two nodes crosses one shaped link.
# - this machine is the cluster's login node: interface nw-login at 10.0.0.254 on the switch,
#   unshaped, so that sbatch, squeue and a browser of the nodes' ports work from here.
# - state: /run/nccl-workshop-cluster (node count, rate); down removes it with the rest.
#
# Refused with a message and exit code 2: not root and no sudo; no `ip`, `tc` or `unshare`; a cluster
# already up; 10.0.0.0/24 already used by this machine; a bad --nodes or --rate. A failed or
# interrupted `up` (Ctrl-C) removes what it made. RATE is tc's: 100mbit, 1gbit, 2.5gbit, ...
set -euo pipefail

PROG=${0##*/}
ARGS=("$@")
STATE=/run/nccl-workshop-cluster
SUBNET=10.0.0
LOGIN_IP=$SUBNET.254
MTU=9000
DEFAULT_RATE=2gbit
MAX_NODES=32

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
refuse() { say "$*"; exit 2; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

node_ns() { echo "nw-node$1"; }
node_ip() { echo "$SUBNET.$(($1 + 1))"; }

need_tools() {
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 ||
      refuse "needs root to make network namespaces and links, and there is no sudo here: run it as root"
    exec sudo -E env PATH="$PATH" bash "$0" "${ARGS[@]}"
  fi
  local t
  for t in ip tc unshare nsenter; do
    command -v "$t" >/dev/null 2>&1 ||
      refuse "cannot find '$t': install iproute2 and util-linux (apt-get install iproute2 util-linux)"
  done
}

# The node count of the cluster that is up, or nothing.
nodes_up() { [ -f "$STATE/nodes" ] && cat "$STATE/nodes" || true; }

# Everything this script may have made, removed; processes still in a node are stopped (TERM,
# then KILL after 3 s). Quiet about what does not exist: it is called after a failed up too.
teardown() {
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^nw-(node[0-9]+|switch)$/ { print $1 }'); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086 # a list of pids
      kill -TERM $pids 2>/dev/null || true
      local waited=0
      while [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && [ $waited -lt 30 ]; do
        sleep 0.1
        waited=$((waited + 1))
      done
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      # shellcheck disable=SC2086
      [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    fi
    ip netns delete "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/${ns:?}"
  done
  # Links still in this namespace: the login cable, and a node's cable made but not yet moved
  # into its namespace when up was interrupted.
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep -E '^nw-' || true); do
    ip link delete "$link" 2>/dev/null || true
  done
  rm -rf /etc/netns/nw-node[0-9]* /etc/netns/nw-switch "$STATE"
}

cmd_up() {
  local nodes=2 rate=$DEFAULT_RATE
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) [ $# -ge 2 ] || refuse "--nodes needs a number"; nodes=$2; shift 2 ;;
      --nodes=*) nodes=${1#--nodes=}; shift ;;
      --rate) [ $# -ge 2 ] || refuse "--rate needs a rate, e.g. 1gbit"; rate=$2; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      *) refuse "up: unknown argument '$1' (up --nodes N [--rate RATE])" ;;
    esac
  done
  [[ $nodes =~ ^[0-9]{1,3}$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le $MAX_NODES ] ||
    refuse "--nodes '$nodes': use a whole number from 1 to $MAX_NODES"
  nodes=$((10#$nodes))
  [[ $rate =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] ||
    refuse "--rate '$rate': use tc's units, e.g. 100mbit, 1gbit, 2.5gbit (bit/s) or 100mbps (bytes/s)"
  need_tools up
  local up
  up=$(nodes_up)
  [ -z "$up" ] || refuse "a cluster of $up nodes is up already: '$0 down' first"
  if ip netns list 2>/dev/null | grep -qE '^nw-(node[0-9]+|switch)( |$)' ||
    ip -o link show 2>/dev/null | grep -qE '^[0-9]+: nw-'; then
    refuse "parts of an earlier cluster are left (namespaces or links named nw-*): '$0 down' removes them"
  fi
  # This machine must not use the box's addresses already (a real 10.0.0.0/24 network).
  local used
  used=$(ip -4 -o addr show 2>/dev/null | awk -v s="$SUBNET." 'index($4, s) == 1 { print $2 " " $4 }' | head -n 1)
  [ -z "$used" ] || refuse "this machine already has an address in $SUBNET.0/24 ($used): the box needs that network"
  used=$(ip -4 route show 2>/dev/null | awk -v s="$SUBNET." 'index($1, s) == 1 || $1 == "10.0.0.0/8" { print; exit }')
  [ -z "$used" ] || refuse "this machine routes $SUBNET.0/24 already ('$used'): the box needs that network"

  # From here on, a failure or an interrupt removes what was made.
  trap 'say "up failed: removing what it made"; teardown; exit 1' ERR
  trap 'say "interrupted: removing what up made"; teardown; exit 130' INT TERM
  mkdir -p "$STATE"
  echo "$rate" >"$STATE/rate"
  local burst
  burst=$(burst_of "$rate")

  ip netns add nw-switch
  ip -n nw-switch link set lo up
  ip -n nw-switch link add br0 type bridge
  ip -n nw-switch link set br0 up
  local k ns
  for ((k = 0; k < nodes; k++)); do
    ns=$(node_ns "$k")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "nw-eth$k" mtu $MTU type veth peer name "nw-port$k" mtu $MTU
    ip link set "nw-eth$k" netns "$ns"
    ip link set "nw-port$k" netns nw-switch
    ip -n "$ns" link set "nw-eth$k" name eth0
    ip -n "$ns" addr add "$(node_ip "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n nw-switch link set "nw-port$k" master br0
    ip -n nw-switch link set "nw-port$k" up
    # The node's outgoing link: RATE, a bucket of `burst` bytes, packets queued up to 100 ms.
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
    mkdir -p "/etc/netns/$ns"
  done
  ip link add nw-login mtu $MTU type veth peer name nw-portl mtu $MTU
  ip link set nw-portl netns nw-switch
  ip -n nw-switch link set nw-portl master br0
  ip -n nw-switch link set nw-portl up
  ip addr add "$LOGIN_IP/24" dev nw-login
  ip link set nw-login up
  for ((k = 0; k < nodes; k++)); do hosts_file "$nodes" >"/etc/netns/$(node_ns "$k")/hosts"; done
  # Every node's link is up (carrier on both ends) before up says it is done.
  for ((k = 0; k < nodes; k++)); do
    local tries=0
    until ip -n "$(node_ns "$k")" link show eth0 | grep -q LOWER_UP; do
      [ $tries -lt 50 ] || { say "node$k's link did not come up"; false; }
      sleep 0.1
      tries=$((tries + 1))
    done
  done
  echo "$nodes" >"$STATE/nodes"
  trap - ERR INT TERM
  say "up: $nodes nodes (node0 = $(node_ip 0) ... node$((nodes - 1)) = $(node_ip $((nodes - 1)))), links of $rate; this machine is $LOGIN_IP"
  say "run a command on a node: $0 exec node0 hostname"
}

# The token bucket's size for RATE: 1 ms of it, at least 64 KiB (a few jumbo frames, and more than
# a TSO segment), so the rate holds for anything larger.
burst_of() {
  local rate=$1 number unit bits
  number=$(echo "$rate" | sed -E 's/[a-z]+$//')
  unit=$(echo "$rate" | sed -E 's/^[0-9.]+//')
  case $unit in
    bit) bits=1 ;; kbit) bits=1000 ;; mbit) bits=1000000 ;; gbit) bits=1000000000 ;;
    tbit) bits=1000000000000 ;; bps) bits=8 ;; kbps) bits=8000 ;; mbps) bits=8000000 ;;
    gbps) bits=8000000000 ;; tbps) bits=8000000000000 ;;
  esac
  awk -v n="$number" -v b="$bits" 'BEGIN { x = n * b / 8 / 1000; if (x < 65536) x = 65536; printf "%d\n", x }'
}

hosts_file() {
  local nodes=$1 k
  echo "127.0.0.1 localhost"
  for ((k = 0; k < nodes; k++)); do echo "$(node_ip "$k") node$k"; done
  echo "$LOGIN_IP login"
}

# The index K of node NODE (nodeK) of the cluster that is up, or a refusal.
node_index() {
  local node=$1 nodes
  nodes=$(nodes_up)
  [ -n "$nodes" ] || refuse "no cluster is up: '$0 up --nodes 2' first"
  [[ $node =~ ^node([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -lt "$nodes" ] ||
    refuse "no node '$node': the cluster has node0 to node$((nodes - 1))"
  echo "${BASH_REMATCH[1]}"
}

cmd_exec() {
  [ $# -ge 2 ] || refuse "exec NODE CMD [ARG...]: which node, and what to run there"
  local node=$1
  shift
  need_tools exec
  local k
  k=$(node_index "$node")
  # The node's network namespace; a UTS namespace named for the node; a mount namespace of its
  # own where the node's hosts file is /etc/hosts (what ip netns exec does, but without
  # remounting /sys, which would hide /sys/fs/cgroup from slurmd); then the command itself
  # (exec: its exit status and signals are the command's).
  local ns
  ns=$(node_ns "$k")
  exec nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private -- \
    sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
    sh "/etc/netns/$ns/hosts" "$node" "$@"
}

# The node's cable cut, as a dead switch port or a pulled plug does: its interface goes down,
# so nothing it sends leaves and nothing reaches it, and no FIN or RST tells anyone.
cmd_cut() {
  [ $# -eq 1 ] || refuse "cut NODE: which node's cable to cut"
  need_tools cut
  local k
  k=$(node_index "$1")
  ip -n "$(node_ns "$k")" link set eth0 down
  say "node$k's cable is cut: '$0 mend node$k' plugs it back in"
}

cmd_mend() {
  [ $# -eq 1 ] || refuse "mend NODE: which node's cable to plug back in"
  need_tools mend
  local k tries=0
  k=$(node_index "$1")
  ip -n "$(node_ns "$k")" link set eth0 up
  until ip -n "$(node_ns "$k")" link show eth0 | grep -q LOWER_UP; do
    [ $tries -lt 50 ] || refuse "node$k's link did not come back up"
    sleep 0.1
    tries=$((tries + 1))
  done
  say "node$k's cable is back"
}

# Node NODE's outgoing link shaped to RATE (the rest of the box keeps its own).
cmd_rate() {
  [ $# -eq 2 ] || refuse "rate NODE RATE: which node's link, and its new rate (e.g. 1mbit)"
  [[ $2 =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] ||
    refuse "rate '$2': use tc's units, e.g. 1mbit, 100mbit, 2gbit (bit/s) or 100mbps (bytes/s)"
  need_tools rate
  local k
  k=$(node_index "$1")
  tc -n "$(node_ns "$k")" qdisc change dev eth0 root tbf rate "$2" burst "$(burst_of "$2")" latency 100ms
  say "node$k's link runs at $2"
}

cmd_status() {
  local nodes
  nodes=$(nodes_up)
  if [ -z "$nodes" ]; then
    echo "no cluster is up"
    ip netns list 2>/dev/null | grep -qE '^nw-' && echo "(parts of one are left: '$0 down' removes them)"
    return 0
  fi
  echo "$nodes nodes, links of $(cat "$STATE/rate"), this machine at $LOGIN_IP (login)"
  local k ns
  for ((k = 0; k < nodes; k++)); do
    ns=$(node_ns "$k")
    printf 'node%d  %-9s  processes: %s\n' "$k" "$(node_ip "$k")" "$(ip netns pids "$ns" 2>/dev/null | wc -l)"
  done
}

# An SVG of the nodes, the switch and the links, with each node's name, address and the rate.
cmd_picture() {
  [ $# -eq 1 ] || refuse "picture FILE.svg: where to draw it"
  local nodes rate
  nodes=$(nodes_up)
  [ -n "$nodes" ] || refuse "no cluster is up: '$0 up --nodes 2' first"
  rate=$(cat "$STATE/rate")
  draw "$nodes" "$rate" >"$1"
  say "wrote $1"
}

draw() {
  local nodes=$1 rate=$2 k x width=$((40 + $1 * 220))
  local sw_x=$((width / 2))
  cat <<EOF
<svg xmlns="http://www.w3.org/2000/svg" width="$width" height="300" font-family="sans-serif" font-size="13">
<title>A cluster in a box: $nodes nodes joined by a switch, each link shaped to $rate</title>
<rect width="100%" height="100%" fill="white"/>
<rect x="$((sw_x - 90))" y="20" width="180" height="44" rx="6" fill="#dde3ea" stroke="#556"/>
<text x="$sw_x" y="40" text-anchor="middle">switch (bridge br0)</text>
<text x="$sw_x" y="57" text-anchor="middle" fill="#446">this machine: login, $LOGIN_IP</text>
EOF
  for ((k = 0; k < nodes; k++)); do
    x=$((40 + k * 220))
    cat <<EOF
<line x1="$((x + 90))" y1="170" x2="$sw_x" y2="64" stroke="#333" stroke-width="2"/>
<text x="$((x + 96))" y="130" fill="#446">$rate</text>
<rect x="$x" y="170" width="180" height="100" rx="8" fill="#7fb3e6" stroke="#556"/>
<text x="$((x + 90))" y="195" text-anchor="middle" font-weight="bold">node$k</text>
<text x="$((x + 90))" y="215" text-anchor="middle">eth0 $(node_ip "$k")</text>
<text x="$((x + 90))" y="235" text-anchor="middle">its ranks: shared memory</text>
<text x="$((x + 90))" y="255" text-anchor="middle">other nodes: TCP</text>
EOF
  done
  echo "</svg>"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  status) shift; need_tools status; cmd_status ;;
  picture) shift; cmd_picture "$@" ;;
  cut) shift; cmd_cut "$@" ;;
  mend) shift; cmd_mend "$@" ;;
  rate) shift; cmd_rate "$@" ;;
  down)
    shift
    [ $# -eq 0 ] || refuse "down takes no arguments"
    need_tools down
    teardown
    say "down: nothing of the box is left"
    ;;
  -h | --help | help) usage ;;
  '') usage >&2; exit 2 ;;
  *) refuse "unknown command '$1': use up, exec, status, picture, cut, mend, rate or down (--help)" ;;
esac

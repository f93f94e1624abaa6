#!/usr/bin/env bash
# Where the groups go, measured on the cluster in a box: example 07 on 2 nodes x 2 ranks, first
# with tensor parallelism inside each node and data parallelism across the link (--mesh dp,tp,
# Megatron's layout), then swapped (--mesh tp,dp: each tensor-parallel pair split over the link),
# and the two side by side: the step time, and the share of it each rank waited for each group.
#
#   cargo build --release
#   scripts/cluster.sh up --nodes 2
#   scripts/tp-layouts.sh
#
# Environment (defaults in brackets): BIN_DIR where the programs are [target/release]; ITERS
# steps per run [30]; BATCH samples per data-parallel rank [256]; HIDDEN the hidden layers' width
# [512]; PORT the store's port on node0 [29510]. Prints one markdown table. Speed is reported
# here, never asserted by a test (tests/cluster.rs runs it and reads the table's shape).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-target/release}
ITERS=${ITERS:-30} BATCH=${BATCH:-256} HIDDEN=${HIDDEN:-512} PORT=${PORT:-29510}
CLUSTER=scripts/cluster.sh

fail() { echo "tp-layouts: $*" >&2; exit 2; }
for arg in "$@"; do
  case $arg in
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) fail "unknown argument '$arg': settings are environment variables (see --help)" ;;
  esac
done
for program in commrun 07-tensor-parallel; do
  [ -x "$BIN_DIR/$program" ] || fail "no $BIN_DIR/$program: build it with 'cargo build --release'"
done
nodes=$(bash "$CLUSTER" status 2>/dev/null | awk 'NR == 1 && $2 == "nodes," { print $1 }')
[ -n "$nodes" ] || fail "no cluster is up: '$CLUSTER up --nodes 2' first"
[ "$nodes" -ge 2 ] || fail "the box has $nodes node; bring it up with --nodes 2"
for n in "$ITERS" "$BATCH" "$HIDDEN" "$PORT"; do
  [[ $n =~ ^[0-9]+$ ]] || fail "'$n': ITERS, BATCH, HIDDEN and PORT are whole numbers"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run MESH: 07 on node0 and node1, two ranks each (commrun, one per node); every rank's line.
run() {
  local mesh=$1 k pids=()
  for k in 0 1; do
    bash "$CLUSTER" exec "node$k" "$BIN_DIR/commrun" --nnodes 2 --node-rank "$k" --nproc-per-node 2 \
      --master-addr 10.0.0.1 --master-port "$PORT" "$BIN_DIR/07-tensor-parallel" --backend cpu \
      --tp 2 --mesh "$mesh" --iters "$ITERS" --batch "$BATCH" --hidden "$HIDDEN" \
      --log-every "$ITERS" >"$work/$mesh.node$k" 2>&1 &
    pids+=($!)
  done
  for k in 0 1; do
    wait "${pids[$k]}" || { cat "$work/$mesh.node$k" >&2; fail "the $mesh run failed on node$k (above)"; }
  done
  cat "$work/$mesh.node0" "$work/$mesh.node1"
}

# The mean over ranks of `step X ms`, tp's and dp's `waited Y ms`, from 07's Rank lines (commrun
# puts `[rank]: ` before each).
means() {
  awk '{ sub(/^\[[0-9]+\]: /, "") } /^Rank [0-9]+ \(dp rank/ {
    for (i = 1; i <= NF; i++) {
      if ($i == "step" && $(i + 2) == "ms;") step += $(i + 1)
      if ($i == "waited") { w = $(i + 1); sub(/;$/, "", w); if (++k % 2) tp += w; else dp += w }
    }
    n++
  }
  END { if (n) printf "%.1f %.1f %.1f %d\n", step / n, tp / n, dp / n, n }'
}

echo "example 07 on the box: 2 nodes x 2 ranks, --tp 2, batch $BATCH a data-parallel rank, hidden $HIDDEN, $ITERS steps, links of $(cat /run/nccl-workshop-cluster/rate)"
echo
echo "| layout | tensor-parallel groups | step (ms) | waiting for tp (ms) | waiting for dp (ms) | waiting share |"
echo "|---|---|---|---|---|---|"
for mesh in dp,tp tp,dp; do
  out=$(run "$mesh")
  read -r step tp dp ranks <<<"$(means <<<"$out")"
  [ "${ranks:-0}" -eq 4 ] || { echo "$out" >&2; fail "the $mesh run printed $ranks rank lines, not 4"; }
  case $mesh in
    dp,tp) layout="dp,tp: tp inside each node, dp across" groups="ranks 0+1 (node0), 2+3 (node1)" ;;
    tp,dp) layout="tp,dp: tp across the link, dp inside" groups="ranks 0+2, 1+3 (node0 + node1)" ;;
  esac
  share=$(awk -v s="$step" -v t="$tp" -v d="$dp" 'BEGIN { printf "%.0f%%", 100 * (t + d) / s }')
  echo "| $layout | $groups | $step | $tp | $dp | $share |"
done

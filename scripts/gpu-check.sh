#!/usr/bin/env bash
# The NCCL backend's run-time checks, for a GPU machine that has the CUDA driver and libnccl but
# no Rust: it runs binaries built elsewhere and prints a pass/fail table.
#
#   here:   cargo build --release                # every program, nccl-probe and collective-check too
#   there:  bash scripts/gpu-check.sh            # BIN_DIR=target/release by default
#
# BACKEND=cpu GPUS=2 runs the same checks on the CPU backend (the test suite does, so this script
# cannot rot where there is no GPU).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BIN_DIR=${BIN_DIR:-target/release}
BACKEND=${BACKEND:-nccl}
if [ -z "${GPUS:-}" ]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [ "${GPUS:-0}" -lt 1 ]; then
  echo "gpu-check: no GPU found (nvidia-smi -L lists none); set GPUS=N to override" >&2
  exit 2
fi
LOGS=${LOGS:-$(mktemp -d)}
declare -a rows=()
failures=0

# check NAME EXPECT_STATUS(0|fail) GREP_PATTERN COMMAND...: runs COMMAND, keeps its output in
# $LOGS/NAME.log, passes when the status matches and the output has GREP_PATTERN.
check() {
  local name=$1 expect=$2 pattern=$3
  shift 3
  local start end status verdict
  start=$(date +%s%N)
  timeout 300 "$@" >"$LOGS/$name.log" 2>&1
  status=$?
  end=$(date +%s%N)
  verdict=PASS
  if [ "$expect" = 0 ] && [ "$status" -ne 0 ]; then verdict=FAIL; fi
  if [ "$expect" = fail ] && [ "$status" -eq 0 ]; then verdict=FAIL; fi
  if ! grep -Eq -- "$pattern" "$LOGS/$name.log"; then verdict=FAIL; fi
  if grep -q "panicked" "$LOGS/$name.log"; then verdict=FAIL; fi
  [ "$verdict" = FAIL ] && failures=$((failures + 1))
  rows+=("$(printf '%-28s %-5s %6s %8sms' "$name" "$verdict" "$status" "$(((end - start) / 1000000))")")
}

n=$GPUS
if [ "$BACKEND" = nccl ]; then
  # What the machine offers NCCL (driver, GPUs, libnccl and its version), shown first.
  check probe 0 "^--backend +auto gives backend: nccl" "$BIN_DIR/nccl-probe"
  cat "$LOGS/probe.log"
fi
check hello-world 0 "^backend: $BACKEND" "$BIN_DIR/00-hello-world" --backend "$BACKEND" -n "$n"
check broadcast 0 "Gpu $((n - 1)) +\| 42 +\| 42 +\| 42 +\| 42 +\|" "$BIN_DIR/01-broadcast" --backend "$BACKEND" -n "$n"
check allreduce 0 "Gpu $((n - 1)) +\| $n +\| $n +\| $n +\| $n +\|" "$BIN_DIR/02-allreduce" --backend "$BACKEND" -n "$n"
check collectives 0 "checks: [0-9]+ passed, 0 failed on $n ranks \($BACKEND\)" \
  "$BIN_DIR/collective-check" --backend "$BACKEND" -n "$n"
# --trace: every rank's calls in one file (the CPU backend adds its sends and receives); on NCCL
# each call also has a slice on the rank's GPU track, timed by CUDA events.
check trace 0 '"cat":"call"' bash -c "'$BIN_DIR/02-allreduce' --backend '$BACKEND' -n '$n' \
  --trace '$LOGS/trace.json' >/dev/null && cat '$LOGS/trace.json'"
if [ "$BACKEND" = nccl ]; then
  check gpu-trace 0 '"cat":"gpu"' cat "$LOGS/trace.json"
fi
# 03's Gloo half as the book would draw it: copy to host, the CPU ring, copy back (on a GPU the
# copies are real device-to-host ones). Where comm-bench was built beside the examples.
if [ -x "$BIN_DIR/comm-bench" ]; then
  gloo_backend=$([ "$BACKEND" = nccl ] && echo auto || echo "$BACKEND")
  check gloo-half-timeline 0 "^wrote .*03-gloo-timeline.svg" bash -c \
    "'$BIN_DIR/03-multinode-gloo-vs-nccl' --backend $gloo_backend -n '$n' --size-mb 8 --iters 3 \
     --warmup 1 --trace '$LOGS/03.json' && '$BIN_DIR/comm-bench' timeline '$LOGS/03.json' \
     -o '$LOGS/03-gloo-timeline.svg'"
fi
if [ "$BACKEND" = nccl ]; then
  # One rank more than GPUs: rank n takes cuda:0 again, and the ranks' PCI bus ids say so.
  check too-many-ranks fail "ranks 0 and $n share one GPU on host .* \\(PCI bus id " \
    "$BIN_DIR/00-hello-world" --backend nccl -n "$((n + 1))"
fi

echo
printf '%-28s %-5s %6s %10s\n' check result status time
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "logs: $LOGS"
[ "$failures" -eq 0 ]

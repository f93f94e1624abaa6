#!/usr/bin/env bash
# The NCCL backend's run-time checks, for a GPU machine that has the CUDA driver and libnccl but
# no Rust: it runs binaries built elsewhere and prints a pass/fail table.
#
#   here:   cargo build --release                # every program, nccl-probe and collective-check too
#   there:  bash scripts/gpu-check.sh            # BIN_DIR=target/release by default
#           bash scripts/gpu-check.sh --which-nccl   # which NCCL the checks would use, only
#
# What a GPU must show: every collective correct, the After grids of 01 and 02 (only the After:
# on one rank the Before grid holds the same numbers), and a result only the collective can make
# (a float Avg all-reduce into a zeroed buffer: NCCL runs a kernel for it even on one rank);
# comm-bench at -z 0, 1 and 3, -a 0 to 3, -I 1 (with -z 0 too) and -m 2 (calls aggregated in one
# NCCL group per iteration) with no wrong element; a rank killed mid-collective ending the others
# within their --timeout + 2 s, naming it; a too-large -e refused size by size; 03 on GPU
# buffers, and 03's ranks agreeing on one backend when one of them cannot run NCCL; the trace's
# GPU slices; groups (split, and 07's tensor-parallel group).
#
# Which NCCL: NCCL_LIBRARY where set; else the nvidia-nccl wheel of the Python that holds PyTorch
# (a GPU machine's python3 on PATH, whose PyTorch for CUDA 13 brings nvidia-nccl-cu13; then the
# course's torch environment, scripts/torch-env.sh dir). The script says which it uses (the
# wheel, its version, the Python), exports NCCL_LIBRARY so that every program loads that one,
# and checks that nccl-probe loaded it. Without either, each program searches as nccl-probe
# shows. --which-nccl says which and exits, 1 when none is named.
#
# Every program gets --timeout $PROGRAM_TIMEOUT (60 s), and each check is killed only after
# $CHECK_LIMIT (120 s), so a hang meets the program's own timeout, abort and watchdog first.
# GPUs are counted as CUDA counts them: CUDA_VISIBLE_DEVICES, where set, names the GPUs
# (nvidia-smi ignores it); GPUS=N overrides.
#
# BACKEND=cpu GPUS=2 runs the same checks on the CPU backend (the test suite does, so this script
# cannot rot where there is no GPU).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BIN_DIR=${BIN_DIR:-target/release}
BACKEND=${BACKEND:-nccl}

# What a Python is asked: its nvidia-nccl wheel's libnccl.so.2, the wheel and its version, and
# which Python it is (tab-separated); nothing when it has no such wheel.
ASK_PYTHON='
import importlib.metadata as metadata, os, sys
import nvidia.nccl
lib = os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2")
wheel = "nvidia.nccl"
for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
    try:
        wheel = name + " " + metadata.version(name)
        break
    except metadata.PackageNotFoundError:
        pass
if os.path.isfile(lib):
    print(lib, wheel, sys.executable, sep="\t")
'

# find_nccl: sets NCCL_FOUND (the libnccl.so.2 to use) and NCCL_FROM (where it came from, in
# words), or returns 1 when neither NCCL_LIBRARY nor a Python's wheel names one. An NCCL_LIBRARY
# that names no library (a file, or a folder holding libnccl.so.2) ends the script.
find_nccl() {
  if [ -n "${NCCL_LIBRARY:-}" ]; then
    NCCL_FOUND=$NCCL_LIBRARY NCCL_FROM="NCCL_LIBRARY"
    [ -d "$NCCL_FOUND" ] && NCCL_FOUND=$NCCL_FOUND/libnccl.so.2
    if [ ! -f "$NCCL_FOUND" ]; then
      echo "gpu-check: NCCL_LIBRARY=$NCCL_LIBRARY names no library (neither a file nor a folder holding libnccl.so.2)" >&2
      exit 2
    fi
    return 0
  fi
  local python answer lib wheel executable
  for python in python3 "$(bash scripts/torch-env.sh dir)/bin/python"; do
    answer=$("$python" -c "$ASK_PYTHON" 2>/dev/null) || continue
    IFS=$'\t' read -r lib wheel executable <<<"$answer"
    [ -f "$lib" ] || continue
    NCCL_FOUND=$lib NCCL_FROM="$wheel, the wheel of $executable"
    return 0
  done
  return 1
}

# use_nccl: says which libnccl the checks use, and why, and exports it as NCCL_LIBRARY (which
# every program links and loads, even where another libnccl.so would load); fails when none.
use_nccl() {
  if find_nccl; then
    echo "gpu-check: NCCL from $NCCL_FOUND ($NCCL_FROM)"
    export NCCL_LIBRARY=$NCCL_FOUND
  else
    NCCL_FOUND=""
    echo "gpu-check: NCCL_LIBRARY is not set and no python3 has an nvidia-nccl wheel: each program searches for libnccl itself (nccl-probe's libnccl line says what it found)"
    return 1
  fi
}

case ${1:-} in
"") ;;
--which-nccl)
  use_nccl
  exit
  ;;
*)
  echo "gpu-check: unknown argument $1 (the only one is --which-nccl; settings are variables: BIN_DIR, BACKEND, GPUS, ...)" >&2
  exit 2
  ;;
esac
PROGRAM_TIMEOUT=${PROGRAM_TIMEOUT:-60}
CHECK_LIMIT=${CHECK_LIMIT:-120}
# The kill check's own, short --timeout: the others must end within it + 2 s.
KILL_TIMEOUT=${KILL_TIMEOUT:-20}
if [ -z "${GPUS:-}" ]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    # CUDA sees the listed GPUs, up to the first entry that is not one ("-1", or empty).
    visible=0
    IFS=, read -ra listed <<<"$CUDA_VISIBLE_DEVICES"
    for entry in "${listed[@]}"; do
      [[ "$entry" =~ ^[[:space:]]*([0-9]+|GPU-.+|MIG-.+)[[:space:]]*$ ]] || break
      visible=$((visible + 1))
    done
    [ "$visible" -lt "$GPUS" ] && GPUS=$visible
  fi
fi
if [ "${GPUS:-0}" -lt 1 ]; then
  echo "gpu-check: no GPU found (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them); set GPUS=N to override" >&2
  exit 2
fi
echo "gpu-check: $GPUS GPU$([ "$GPUS" = 1 ] || echo s), backend $BACKEND, programs' --timeout $PROGRAM_TIMEOUT s, each check at most $CHECK_LIMIT s"
NCCL_FOUND=""
[ "$BACKEND" = nccl ] && use_nccl
LOGS=${LOGS:-$(mktemp -d)}
declare -a rows=()
failures=0

# check NAME EXPECT_STATUS(0|fail) GREP_PATTERN COMMAND...: runs COMMAND, keeps its output in
# $LOGS/NAME.log, passes when the status matches and the output has GREP_PATTERN. With FROM set
# (FROM='^After ' check ...), only the output from the first line matching FROM on is searched.
check() {
  local name=$1 expect=$2 pattern=$3
  shift 3
  local start end status verdict
  start=$(date +%s%N)
  timeout "$CHECK_LIMIT" "$@" >"$LOGS/$name.log" 2>&1
  status=$?
  end=$(date +%s%N)
  verdict=PASS
  if [ "$expect" = 0 ] && [ "$status" -ne 0 ]; then verdict=FAIL; fi
  if [ "$expect" = fail ] && [ "$status" -eq 0 ]; then verdict=FAIL; fi
  # (grep reads it all: with -q it would stop at the first match, and awk's broken pipe would
  # fail the pipeline under pipefail.)
  if ! awk -v from="${FROM:-}" 'from == "" || $0 ~ from { on = 1 } on' "$LOGS/$name.log" |
    grep -E -- "$pattern" >/dev/null; then verdict=FAIL; fi
  if grep -q "panicked" "$LOGS/$name.log"; then verdict=FAIL; fi
  [ "$verdict" = FAIL ] && failures=$((failures + 1))
  rows+=("$(printf '%-28s %-5s %6s %8sms' "$name" "$verdict" "$status" "$(((end - start) / 1000000))")")
}

# skip NAME REASON: a row for a check that cannot run here, and why (not a failure).
skip() {
  rows+=("$(printf '%-28s %-5s %6s %10s  %s' "$1" SKIP - - "$2")")
}

# A free-enough port for ranks started by hand.
port() {
  echo $((20000 + RANDOM % 20000))
}

n=$GPUS
if [ "$BACKEND" = nccl ]; then
  # What the machine offers NCCL (driver, GPUs, libnccl and its version), shown first.
  check probe 0 "^--backend +auto gives backend: nccl" "$BIN_DIR/nccl-probe"
  cat "$LOGS/probe.log"
  # The library the programs load is the one named above (the probe's libnccl line names the
  # file it loaded, links resolved).
  if [ -n "$NCCL_FOUND" ]; then
    check nccl-used 0 "^libnccl +NCCL [0-9]" grep -F "from $(realpath "$NCCL_FOUND")" "$LOGS/probe.log"
  fi
fi
check hello-world 0 "^backend: $BACKEND" "$BIN_DIR/00-hello-world" --backend "$BACKEND" -n "$n" --timeout "$PROGRAM_TIMEOUT"
# 01 and 02: the last rank's row of the After grid (with one rank, the Before grid holds the same
# numbers, so only the After grid is read; what only a collective can make is avg-written's).
FROM='^After ' check broadcast 0 "Gpu $((n - 1)) +\| 42 +\| 42 +\| 42 +\| 42 +\|" \
  "$BIN_DIR/01-broadcast" --backend "$BACKEND" -n "$n" --timeout "$PROGRAM_TIMEOUT"
FROM='^After ' check allreduce 0 "Gpu $((n - 1)) +\| $n +\| $n +\| $n +\| $n +\|" \
  "$BIN_DIR/02-allreduce" --backend "$BACKEND" -n "$n" --timeout "$PROGRAM_TIMEOUT"
check collectives 0 "checks: [0-9]+ passed, 0 failed on $n ranks \($BACKEND\)" \
  "$BIN_DIR/collective-check" --backend "$BACKEND" -n "$n" --timeout "$PROGRAM_TIMEOUT"
# A result only the collective can make, on any number of ranks: a float Avg all-reduce, out of
# place, of 1048576 floats (nearly all of them not zero) into a receive buffer of zeros. On one rank
# NCCL turns Avg of floats into a PreMulSum by 1/1 and launches its one-rank kernel for it
# (src/enqueue.cc, hostToDevRedOp and taskAppend; src/device/onerank.cu), where an in-place sum
# enqueues nothing at all.
check avg-written 0 "^all_reduce avg float out-of-place +1048576 +0  PASS$" cat "$LOGS/collectives.log"
# --trace: every rank's calls in one file (the CPU backend adds its sends and receives); on NCCL
# each call also has a slice on the rank's GPU track, timed by CUDA events.
check trace 0 '"cat":"call"' bash -c "'$BIN_DIR/02-allreduce' --backend '$BACKEND' -n '$n' \
  --timeout '$PROGRAM_TIMEOUT' --trace '$LOGS/trace.json' >/dev/null && cat '$LOGS/trace.json'"
if [ "$BACKEND" = nccl ]; then
  check gpu-trace 0 '"cat":"gpu"' cat "$LOGS/trace.json"
fi
# 06, data-parallel training: on NCCL each gradient bucket is copied to the GPU by the comm
# thread, all-reduced there by NCCL and copied back (the model computes on the host). Passes when
# it trains and every rank ends with the same weights (one checksum).
check ddp-training 0 "^Rank $((n - 1)): weights" bash -c "out=\$('$BIN_DIR/06-ddp-training' \
  --backend '$BACKEND' -n '$n' --timeout '$PROGRAM_TIMEOUT' --iters 40 --bucket-mb 0.1) || exit 1
  echo \"\$out\"; [ \$(echo \"\$out\" | grep -o 'weights [0-9a-f]*' | sort -u | wc -l) = 1 ]"
# Groups: the job split by color (on NCCL by ncclCommSplit, NCCL 2.18 or later; on one GPU a
# group of one, which still takes NCCL's split and its own stream), each group's all-reduces
# checked while the job's run on another thread; then 07, the model split over one
# tensor-parallel group of all the GPUs (its two all-reduces a step on a split communicator).
check split 0 "at the same time: right on (all $n ranks|the one rank)" "$BIN_DIR/split-check" \
  --backend "$BACKEND" -n "$n" --len 65536 --timeout "$PROGRAM_TIMEOUT"
check tensor-parallel 0 "^Rank $((n - 1)) \(dp rank 0, tp rank $((n - 1))\): weights" \
  "$BIN_DIR/07-tensor-parallel" --backend "$BACKEND" -n "$n" --tp "$n" --hidden $((64 * n)) \
  --iters 20 --timeout "$PROGRAM_TIMEOUT"
# 03 on both halves: on NCCL the Gloo half stages GPU buffers through the host, the NCCL half
# reduces them on the GPUs, and rank 0 compares; on the CPU the NCCL half says why it is skipped.
gloo_backend=$([ "$BACKEND" = nccl ] && echo auto || echo "$BACKEND")
gloo_vs_nccl=$([ "$BACKEND" = nccl ] && echo "^NCCL was [0-9.]+x faster than the CPU path" ||
  echo "^Rank 0 \(CPU, Gloo-style over [a-z+]+\): all-reduce 8 MB took")
check gloo-vs-nccl 0 "$gloo_vs_nccl" "$BIN_DIR/03-multinode-gloo-vs-nccl" --backend "$gloo_backend" \
  -n "$n" --size-mb 8 --iters 3 --warmup 1 --timeout "$PROGRAM_TIMEOUT"
# 03's two ranks disagree: rank 1 sees no GPU (CUDA_VISIBLE_DEVICES=""), rank 0 may see one.
# The job picks one backend for both, at once (not after a rank's 60 s timeout), and says which
# rank could not run NCCL; on the CPU no rank can, and it says so as one reason.
agreed=$([ "$BACKEND" = nccl ] && echo "skipped: NCCL cannot run on rank 1 \(host " ||
  echo "skipped: NCCL cannot run here: ")
agree_port=$(port)
check backend-agreed 0 "$agreed" bash -c "
  '$BIN_DIR/03-multinode-gloo-vs-nccl' --world-size 2 --rank 0 --master-port $agree_port \
    --size-mb 1 --iters 2 --warmup 1 --timeout '$PROGRAM_TIMEOUT' &
  zero=\$!
  CUDA_VISIBLE_DEVICES= '$BIN_DIR/03-multinode-gloo-vs-nccl' --world-size 2 --rank 1 \
    --master-port $agree_port --size-mb 1 --iters 2 --warmup 1 --timeout '$PROGRAM_TIMEOUT' \
    >/dev/null || exit \$?
  wait \$zero"

# comm-bench, the nccl-tests of this repository: next to the examples (target/release), or one
# folder up (the test suite's BIN_DIR is target/debug/examples).
COMM_BENCH=""
for candidate in "$BIN_DIR/comm-bench" "$BIN_DIR/../comm-bench"; do
  [ -x "$candidate" ] && COMM_BENCH=$candidate && break
done
if [ -n "$COMM_BENCH" ]; then
  # 03's Gloo half as the book would draw it: copy to host, the CPU ring, copy back (on a GPU
  # the copies are real device-to-host ones).
  check gloo-half-timeline 0 "^wrote .*03-gloo-timeline.svg" bash -c \
    "'$BIN_DIR/03-multinode-gloo-vs-nccl' --backend $gloo_backend -n '$n' --size-mb 8 --iters 3 \
     --warmup 1 --timeout '$PROGRAM_TIMEOUT' --trace '$LOGS/03.json' && '$COMM_BENCH' timeline \
     '$LOGS/03.json' -o '$LOGS/03-gloo-timeline.svg'"
  # Every collective, each -z, each -a, and -I 1 (CUDA events on NCCL): nothing wrong. comm-bench
  # exits non-zero on a wrong element; the footer says 0 for each table.
  # 8 B to 64 MiB on GPUs (NCCL's protocols and algorithms change over it); less on the CPU.
  bench_max=${BENCH_MAX:-$([ "$BACKEND" = nccl ] && echo 64M || echo 256K)}
  bench=("$COMM_BENCH" --backend "$BACKEND" --world-sizes "$n" --collectives all -b 8
    -e "$bench_max" -f 32 -w 1 -n 5 --timeout "$PROGRAM_TIMEOUT")
  check bench-z0-a0 0 "Wrong elements +: 0 OK" "${bench[@]}" -z 0 -a 0
  check bench-z0-I1 0 "Wrong elements +: 0 OK" "${bench[@]}" -z 0 -I 1
  check bench-z1-a1-I1 0 "Wrong elements +: 0 OK" "${bench[@]}" -z 1 -a 1 -I 1
  check bench-z3-a2-I1 0 "Wrong elements +: 0 OK" "${bench[@]}" -z 3 -a 2 -I 1
  check bench-z3-a3 0 "Wrong elements +: 0 OK" "${bench[@]}" -z 3 -a 3
  # Two calls aggregated per timed iteration (nccl-tests' -m): on NCCL one ncclGroupStart/End
  # each, waited for after its end: the group path, its group-safe buffers and deferred aborts.
  check bench-m2-z1 0 "Wrong elements +: 0 OK" "${bench[@]}" -z 1 -m 2
  # -e far beyond any memory: 1 MiB is measured, 1 TiB + 1 MiB and 2 TiB + 1 MiB are skipped
  # one by one, each with the memory it would need (the GPU's on NCCL), and the run succeeds.
  memory=$([ "$BACKEND" = nccl ] && echo "GPU memory" || echo "host memory")
  check bench-too-large 0 "^2 sizes skipped for $memory$" bash -c "
    set -o pipefail
    '$COMM_BENCH' --backend '$BACKEND' --world-sizes '$n' -b 1M -e 3T -i 1T -w 0 -n 2 \
      --timeout '$PROGRAM_TIMEOUT' | tee '$LOGS/bench-too-large.out' || exit \$?
    echo \"\$(grep -Ec '^# skipped all_reduce at [0-9]+ B: .*$memory' \
      '$LOGS/bench-too-large.out') sizes skipped for $memory\""
else
  skip comm-bench "no comm-bench in $BIN_DIR or its parent (cargo build --release builds it)"
fi
if [ "$BACKEND" = nccl ]; then
  # One rank more than GPUs: rank n takes cuda:0 again, and the ranks' PCI bus ids say so.
  check too-many-ranks fail "ranks 0 and $n share one GPU on host .* \\(PCI bus id " \
    "$BIN_DIR/00-hello-world" --backend nccl -n "$((n + 1))" --timeout "$PROGRAM_TIMEOUT"
fi

# A rank killed (SIGKILL) in the middle of an all-reduce: the other ends by itself, within its
# --timeout + 2 s of the kill, with a non-zero exit and a message naming rank 1. Two ranks
# started as torchrun would start them, so that the script knows which process is rank 1.
kill_check() {
  local name=rank-killed log="$LOGS/rank-killed.log" bench_port start end status verdict
  bench_port=$(port)
  start=$(date +%s%N)
  local pids=()
  for rank in 0 1; do
    RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$bench_port "$COMM_BENCH" --backend "$BACKEND" --collectives all_reduce \
      -b 16M -e 16M -w 0 -n 1000000 -c 0 --timeout "$KILL_TIMEOUT" \
      >"$LOGS/rank-killed.$rank.log" 2>&1 &
    pids+=($!)
  done
  # The table's header comes just before the timed loop: wait for it, then a little longer.
  for _ in $(seq 600); do
    grep -q "^# comm-bench" "$LOGS/rank-killed.0.log" 2>/dev/null && break
    kill -0 "${pids[0]}" 2>/dev/null || break
    sleep 0.1
  done
  sleep 2
  kill -KILL "${pids[1]}" 2>/dev/null
  local killed limit
  killed=$(date +%s%N)
  limit=$(((KILL_TIMEOUT + 2) * 1000))
  while kill -0 "${pids[0]}" 2>/dev/null && [ $((($(date +%s%N) - killed) / 1000000)) -lt "$limit" ]; do
    sleep 0.1
  done
  verdict=PASS
  if kill -0 "${pids[0]}" 2>/dev/null; then
    echo "rank 0 still running $((KILL_TIMEOUT + 2)) s after rank 1 was killed" >>"$log"
    verdict=FAIL
    kill -KILL "${pids[0]}" 2>/dev/null
  fi
  wait "${pids[0]}"
  status=$?
  wait "${pids[1]}" 2>/dev/null
  end=$(date +%s%N)
  cat "$LOGS/rank-killed.0.log" >>"$log"
  echo "rank 0 ended $(((end - killed) / 1000000)) ms after rank 1 was killed (limit ${limit} ms)" >>"$log"
  [ "$status" -eq 0 ] && verdict=FAIL
  grep -q "rank 1" "$LOGS/rank-killed.0.log" || verdict=FAIL
  grep -q "panicked" "$LOGS/rank-killed.0.log" && verdict=FAIL
  [ "$verdict" = FAIL ] && failures=$((failures + 1))
  rows+=("$(printf '%-28s %-5s %6s %8sms' "$name" "$verdict" "$status" "$(((end - start) / 1000000))")")
}
if [ "$BACKEND" = nccl ] && [ "$n" -lt 2 ]; then
  skip rank-killed "needs 2 ranks, and NCCL one GPU per rank: $n GPU here"
elif [ -z "$COMM_BENCH" ]; then
  skip rank-killed "needs comm-bench"
else
  # (bash's own "Killed" notice for rank 1 goes nowhere: the check's logs say what happened.)
  kill_check 2>/dev/null
fi

echo
printf '%-28s %-5s %6s %10s\n' check result status time
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "logs: $LOGS"
[ "$failures" -eq 0 ]

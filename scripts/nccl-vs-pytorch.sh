#!/usr/bin/env bash
# One figure, one run: a 100 MB f32 in-place all-reduce through our API (comm-bench) against the
# same call through PyTorch (torch.distributed with NCCL), world size 1, on the same GPU.
# Like gpu-check.sh it runs binaries built elsewhere:
#
#   here:   cargo build --release -p comm-bench
#   there:  bash scripts/nccl-vs-pytorch.sh        # BIN_DIR=target/release by default
#
# BACKEND=cpu compares our CPU backend with PyTorch's Gloo instead (any machine with torch).
# SIZE_MB, ITERS, WARMUP and PYTHON (default python3) change the run. Both sides time the same
# way: warm-up, then per iteration one all-reduce waited for to the end; the median is reported.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-target/release}
BACKEND=${BACKEND:-nccl}
PYTHON=${PYTHON:-python3}
SIZE_MB=${SIZE_MB:-100}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
if ! "$PYTHON" -c 'import torch.distributed' 2>/dev/null; then
  echo "nccl-vs-pytorch: $PYTHON cannot import torch; set PYTHON to one that can" >&2
  exit 2
fi

bytes=$((SIZE_MB * 1000000))
csv=$(mktemp)
"$BIN_DIR/comm-bench" --backend "$BACKEND" --world-sizes 1 -b "$bytes" -e "$bytes" \
  -n "$ITERS" -w "$WARMUP" --csv "$csv" >&2
# The in-place row's median time (PyTorch's all_reduce is in place).
ours_us=$(awk -F, '$10 == "in-place" { print $13 }' "$csv")
if [ -z "$ours_us" ]; then
  echo "nccl-vs-pytorch: comm-bench wrote no in-place row to $csv" >&2
  exit 1
fi

theirs_us=$("$PYTHON" - "$BACKEND" "$SIZE_MB" "$ITERS" "$WARMUP" <<'EOF'
import socket, statistics, sys, time
import torch, torch.distributed as dist

backend, size_mb, iters, warmup = sys.argv[1], *map(int, sys.argv[2:5])
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("nccl" if backend == "nccl" else "gloo",
                        init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
device = "cuda:0" if backend == "nccl" else "cpu"
x = torch.ones(size_mb * 1_000_000 // 4, dtype=torch.float32, device=device)
wait = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
for _ in range(warmup):
    dist.all_reduce(x)
    wait()
times = []
for _ in range(iters):
    start = time.perf_counter()
    dist.all_reduce(x)
    wait()
    times.append(time.perf_counter() - start)
dist.destroy_process_group()
print(f"{statistics.median(times) * 1e6:.3f}")
EOF
)

awk -v ours="$ours_us" -v theirs="$theirs_us" -v bytes="$bytes" -v n="$SIZE_MB" -v be="$BACKEND" 'BEGIN {
  printf "all-reduce %d MB f32 in place, world size 1, %s, median of each:\n", n, be
  printf "  ours     %12.2f us  algbw %10.2f GB/s\n", ours, bytes / ours / 1e3
  printf "  PyTorch  %12.2f us  algbw %10.2f GB/s\n", theirs, bytes / theirs / 1e3
  printf "  PyTorch time / ours: %.2fx\n", theirs / ours
}'

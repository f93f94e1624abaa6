#!/usr/bin/env bash
# Our all-reduce against PyTorch's, one run: an f32 in-place all-reduce through our API
# (comm-bench) and the same call through torch.distributed (NCCL, or Gloo with BACKEND=cpu), on
# the same ranks, for each size; each size's line gives PyTorch's time over ours.
# Like gpu-check.sh it runs binaries built elsewhere:
#
#   here:   cargo build --release
#   there:  bash scripts/nccl-vs-pytorch.sh        # BIN_DIR=target/release by default
#
# WORLD_SIZE ranks (default: every GPU nvidia-smi lists; 2 with BACKEND=cpu). World size 1 is
# refused: an all-reduce of one rank moves nothing, so it would compare call overheads only.
# BACKEND=cpu compares our CPU backend with PyTorch's Gloo instead (any machine with torch).
# SIZES_MB (default "1 16 100"; SIZE_MB=N for one size), ITERS, WARMUP and PYTHON (default
# python3) change the run. Both sides time the same way: warm-up, then per iteration a barrier and
# one all-reduce waited for to the end; an iteration's time is the slowest rank's; the median of
# the iterations is reported (ours: comm-bench -z 3, its time_us_median).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-target/release}
BACKEND=${BACKEND:-nccl}
PYTHON=${PYTHON:-python3}
SIZES_MB=${SIZES_MB:-${SIZE_MB:-1 16 100}}
read -ra sizes_mb <<<"$SIZES_MB"
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
if [ -z "${WORLD_SIZE:-}" ]; then
  if [ "$BACKEND" = nccl ]; then
    WORLD_SIZE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  else
    WORLD_SIZE=2
  fi
fi
if [ "${WORLD_SIZE:-0}" -lt 1 ]; then
  echo "nccl-vs-pytorch: no GPU found (nvidia-smi -L lists none); set WORLD_SIZE=N to override," \
    "or BACKEND=cpu to compare the CPU paths" >&2
  exit 2
fi
if [ "$WORLD_SIZE" -lt 2 ]; then
  echo "nccl-vs-pytorch: world size $WORLD_SIZE: nothing to compare. An all-reduce of one" \
    "rank moves no data (both sides return at once), so the times would be call overheads, not" \
    "communication. Run it on a node with 2 or more GPUs (WORLD_SIZE=N picks how many), or" \
    "BACKEND=cpu to compare the CPU paths (ours and Gloo) on 2 ranks." >&2
  exit 2
fi
if ! "$PYTHON" -c 'import torch.distributed' 2>/dev/null; then
  echo "nccl-vs-pytorch: $PYTHON cannot import torch; set PYTHON to one that can" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Ours: one comm-bench run per size, in-place rows only (PyTorch's all_reduce is in place).
for mb in "${sizes_mb[@]}"; do
  bytes=$((mb * 1000000))
  "$BIN_DIR/comm-bench" --backend "$BACKEND" --world-sizes "$WORLD_SIZE" -b "$bytes" -e "$bytes" \
    -n "$ITERS" -w "$WARMUP" -z 3 --collectives all_reduce -d float --csv "$work/ours-$mb.csv" >&2
  # Columns by their header names, so a column added to the CSV cannot shift what is read.
  ours_us=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $col["placement"] == "in-place" { print $col["time_us_median"] }' "$work/ours-$mb.csv")
  if [ -z "$ours_us" ]; then
    echo "nccl-vs-pytorch: comm-bench wrote no in-place row for $mb MB ($work/ours-$mb.csv)" >&2
    exit 1
  fi
  echo "$mb $ours_us" >>"$work/ours"
done

# Theirs: one torch.distributed job of WORLD_SIZE processes timing every size; rank 0 writes
# "MB median_us" lines.
# From a file, not stdin: torch.multiprocessing's spawned ranks re-import the main script.
cat >"$work/theirs.py" <<'PY'
import socket, statistics, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def rank_main(rank, backend, world_size, iters, warmup, out, sizes, port):
    dist.init_process_group("nccl" if backend == "nccl" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    wait = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    lines = []
    for mb in sizes:
        x = torch.ones(mb * 1_000_000 // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(x)
            wait()
        times = []
        for _ in range(iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(x)
            wait()
            times.append(time.perf_counter() - start)
        # Each iteration's time is the slowest rank's, reduced after the loop as comm-bench does.
        slowest = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        lines.append(f"{mb} {statistics.median(slowest.tolist()) * 1e6:.3f}\n")
    if rank == 0:
        with open(out, "w") as f:
            f.writelines(lines)
    dist.destroy_process_group()

if __name__ == "__main__":
    backend, world_size, iters, warmup, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    sizes = [int(s) for s in sys.argv[6:]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(backend, world_size, iters, warmup, out, sizes, port),
             nprocs=world_size)
PY
"$PYTHON" "$work/theirs.py" "$BACKEND" "$WORLD_SIZE" "$ITERS" "$WARMUP" "$work/theirs" "${sizes_mb[@]}"

# One block per size: both medians and the ratio.
awk -v n="$WORLD_SIZE" -v be="$BACKEND" '
  FNR == NR { ours[$1] = $2; order[++count] = $1; next }
  { theirs[$1] = $2 }
  END {
    for (i = 1; i <= count; i++) {
      mb = order[i]; bytes = mb * 1000000
      if (!(mb in theirs)) { printf "nccl-vs-pytorch: PyTorch gave no time for %d MB\n", mb > "/dev/stderr"; exit 1 }
      printf "all-reduce %d MB f32 in place, world size %d, %s, median of each:\n", mb, n, be
      printf "  ours     %12.2f us  algbw %10.2f GB/s\n", ours[mb], bytes / ours[mb] / 1e3
      printf "  PyTorch  %12.2f us  algbw %10.2f GB/s\n", theirs[mb], bytes / theirs[mb] / 1e3
      printf "  PyTorch time / ours: %.2fx\n", theirs[mb] / ours[mb]
    }
  }' "$work/ours" "$work/theirs"

#!/usr/bin/env bash
# Our CPU backend against PyTorch's Gloo, on this machine, in one go: each collective, world size
# and size is timed by comm-bench (--backend cpu) and by torch.distributed (Gloo), then printed
# as a markdown table with Gloo's time over ours, and one summary line per collective.
#
#   cargo build --release
#   bash scripts/cpu-vs-gloo.sh                  # BIN_DIR=target/release by default
#
# Environment (defaults in brackets):
#   BIN_DIR      where comm-bench is [target/release]
#   PYTHON       a python that has PyTorch [python3]
#   WORLD_SIZES  ranks, space-separated, each 2 or more ["2 4 8"]
#   SIZES        comm-bench's sizes: KB, MB, GB are x1000, K, M, G x1024 ["1MB 10MB 100MB 1GB"]
#   COLLECTIVES  any of all_reduce broadcast all_gather reduce_scatter [all four]
#   ITERS        timed iterations [20];  WARMUP  untimed ones before them [5]
#   TRANSPORT    passed to comm-bench as --transport (auto, shm, tcp) when set; else its default
# Size means what comm-bench means: the whole buffer, i.e. the gathered output of all_gather and
# the input of reduce_scatter (world size x the per-rank piece). A (size, world size) whose
# buffers would not fit (3 x size x world size over MemAvailable) is skipped, with a line on stderr.
#
# Both sides time alike: f32, warm-up, then per iteration a barrier and one call waited for; an
# iteration's time is the slowest rank's; the median is reported (comm-bench -z 3). Gloo's
# all_reduce and broadcast work in place, so our in-place time is compared; its
# all_gather_into_tensor and reduce_scatter_tensor out of place, so our out-of-place time is. Our
# other placement is shown beside it for information. Each torch rank sets
# torch.set_num_threads(1), so that N ranks do not each start a pool of one thread per core.
set -euo pipefail
here=$(dirname "$0")

peer_script=cpu-vs-gloo
# shellcheck source=scripts/peer-bench.sh
. "$here/peer-bench.sh"
take_no_arguments "$@"

cd "$here/.."
BIN_DIR=${BIN_DIR:-target/release}
PYTHON=${PYTHON:-python3}
WORLD_SIZES=${WORLD_SIZES:-2 4 8}
SIZES=${SIZES:-1MB 10MB 100MB 1GB}
COLLECTIVES=${COLLECTIVES:-all_reduce broadcast all_gather reduce_scatter}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
TRANSPORT=${TRANSPORT:-}

check_knobs
# Before any run: without torch there is nothing to compare with.
if ! torch_version=$("$PYTHON" -c 'import torch.distributed, torch; print(torch.__version__)' \
  2>/dev/null); then
  fail "$PYTHON cannot import torch.distributed: this script needs PyTorch (pip install torch)," \
    "or PYTHON=/path/to/python for one that has it"
fi

plan_runs

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
load_before=$(cut -d ' ' -f 1 /proc/loadavg)
run_ours

# Theirs: one torch.distributed Gloo job per world size timing every (collective, bytes) we
# timed there; rank 0 writes "collective bytes median_us" lines. The job is a file, not python's
# stdin: spawned ranks import their function from the parent's main script by its path.
cat >"$work/gloo.py" <<'PY'
import socket, statistics, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def rank_main(rank, world_size, iters, warmup, out, cases, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    lines = []
    for name, nbytes in cases:
        # comm-bench's size is the whole buffer: the output of all_gather, the input of
        # reduce_scatter; the per-rank piece is 1/world_size of it.
        whole = torch.ones(nbytes // 4, dtype=torch.float32)
        piece = torch.ones(nbytes // 4 // world_size, dtype=torch.float32)
        call = {
            "all_reduce": lambda: dist.all_reduce(whole),
            "broadcast": lambda: dist.broadcast(whole, src=0),
            "all_gather": lambda: dist.all_gather_into_tensor(whole, piece),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(piece, whole),
        }[name]
        for _ in range(warmup):
            call()
        times = []
        for _ in range(iters):
            dist.barrier()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        # Each iteration's time is the slowest rank's, reduced after the loop as comm-bench does.
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        lines.append(f"{name} {nbytes} {statistics.median(slowest.tolist()) * 1e6:.3f}\n")
    if rank == 0:
        with open(out, "w") as f:
            f.writelines(lines)
    dist.destroy_process_group()

if __name__ == "__main__":
    world_size, iters, warmup, out = *map(int, sys.argv[1:4]), sys.argv[4]
    cases = [(c, int(b)) for c, b in (a.split(":") for a in sys.argv[5:])]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(world_size, iters, warmup, out, cases, port), nprocs=world_size)
PY
for n in "${world_sizes[@]}"; do
  mapfile -t cases < <(awk -v n="$n" '$1 == n { print $3 ":" $4 }' "$work/ours" | sort -u)
  [ ${#cases[@]} -gt 0 ] || continue
  echo "cpu-vs-gloo: Gloo, ${#cases[@]} cases on $n ranks" >&2
  "$PYTHON" "$work/gloo.py" "$n" "$ITERS" "$WARMUP" "$work/theirs-$n" "${cases[@]}"
  awk -v n="$n" '{ print n, $0 }' "$work/theirs-$n" >>"$work/theirs"
done

# The table: collectives in COLLECTIVES' order, then world sizes and sizes as run.
echo "# ours: comm-bench --backend cpu${TRANSPORT:+ --transport $TRANSPORT}; Gloo: torch" \
  "$torch_version; f32, median of $ITERS iterations after $WARMUP warm-up, slowest rank's;" \
  "$(nproc) cores, load average $load_before before the runs, $(cut -d ' ' -f 1 /proc/loadavg) after"
echo
print_table Gloo

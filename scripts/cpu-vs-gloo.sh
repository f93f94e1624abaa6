#!/usr/bin/env bash
# Our CPU backend against PyTorch's Gloo, on this machine, in one go: each collective, world size
# and size is timed by comm-bench (--backend cpu) and by torch.distributed (Gloo), then printed
# as a markdown table with Gloo's time over ours, and one summary line per collective.
#
#   cargo build --release --examples --bins
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
# iteration's time is the slowest rank's; the median is reported (comm-bench -z 1). Gloo's
# all_reduce and broadcast work in place, so our in-place time is compared; its
# all_gather_into_tensor and reduce_scatter_tensor out of place, so our out-of-place time is. Our
# other placement is shown beside it for information. Each torch rank sets
# torch.set_num_threads(1), so that N ranks do not each start a pool of one thread per core.
set -euo pipefail
here=$(dirname "$0")

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
for arg in "$@"; do
  case $arg in
    -h | --help) usage; exit 0 ;;
    *)
      echo "cpu-vs-gloo: unknown argument '$arg': the script takes none but -h/--help;" \
        "settings are environment variables (see --help)" >&2
      exit 2 ;;
  esac
done

cd "$here/.."
BIN_DIR=${BIN_DIR:-target/release}
PYTHON=${PYTHON:-python3}
WORLD_SIZES=${WORLD_SIZES:-2 4 8}
SIZES=${SIZES:-1MB 10MB 100MB 1GB}
COLLECTIVES=${COLLECTIVES:-all_reduce broadcast all_gather reduce_scatter}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
TRANSPORT=${TRANSPORT:-}

fail() { echo "cpu-vs-gloo: $*" >&2; exit 2; }

# bytes_of SIZE: comm-bench's size syntax (crates/comm-bench/src/units.rs) in bytes, or failure.
# At most 1 TiB, far beyond one machine, so that no product below overflows bash's integers.
bytes_of() {
  local re='^([0-9]{1,15})([KkMmGgTt]?)(B|b|iB|ib|IB)?$' n letter unit power=0 base=1024
  [[ $1 =~ $re ]] || return 1
  n=$((10#${BASH_REMATCH[1]})) letter=${BASH_REMATCH[2]} unit=${BASH_REMATCH[3]}
  case $letter in K | k) power=1 ;; M | m) power=2 ;; G | g) power=3 ;; T | t) power=4 ;; esac
  case $unit in B | b) base=1000 ;; iB | ib | IB) [ -n "$letter" ] || return 1 ;; esac
  [ "$n" -le $(((1 << 40) / base ** power)) ] || return 1
  echo $((n * base ** power))
}

# Knobs first: a typo is reported at once, whatever python is at hand. (Lists are read into
# arrays, so that a '*' in one is not expanded as a file name.)
read -ra world_sizes <<<"$WORLD_SIZES"
read -ra sizes <<<"$SIZES"
read -ra asked <<<"$COLLECTIVES"
[ ${#asked[@]} -gt 0 ] || fail "COLLECTIVES is empty"
[ ${#world_sizes[@]} -gt 0 ] || fail "WORLD_SIZES is empty"
[ ${#sizes[@]} -gt 0 ] || fail "SIZES is empty"
for c in "${asked[@]}"; do
  case $c in
    all_reduce | broadcast | all_gather | reduce_scatter) ;;
    *) fail "unknown collective '$c' in COLLECTIVES: use all_reduce, broadcast, all_gather, reduce_scatter" ;;
  esac
done
for n in "${world_sizes[@]}"; do
  # One rank moves nothing: both sides would time call overheads, not communication.
  if ! [[ $n =~ ^[0-9]{1,4}$ ]] || [ "$((10#$n))" -lt 2 ]; then
    fail "world size '$n' in WORLD_SIZES: use whole numbers from 2 to 9999"
  fi
done
for s in "${sizes[@]}"; do
  if ! b=$(bytes_of "$s") || [ "$b" -eq 0 ]; then
    fail "size '$s' in SIZES: write bytes as a whole number with KB, MB, GB (x1000) or K, M, G" \
      "(x1024), e.g. 100MB, from 1 byte to 1 TiB"
  fi
done
if ! [[ $ITERS =~ ^[0-9]{1,9}$ ]] || [ "$((10#$ITERS))" -lt 1 ]; then
  fail "ITERS='$ITERS': use a whole number of 1 or more"
fi
[[ $WARMUP =~ ^[0-9]{1,9}$ ]] || fail "WARMUP='$WARMUP': use a whole number of 0 or more"
# A name given twice is run once.
unique() { awk '!seen[$0]++'; }
mapfile -t collectives < <(printf '%s\n' "${asked[@]}" | unique)
mapfile -t world_sizes < <(printf '%s\n' "${world_sizes[@]}" | unique)
mapfile -t sizes < <(printf '%s\n' "${sizes[@]}" | unique)

if [ ! -x "$BIN_DIR/comm-bench" ]; then
  fail "no $BIN_DIR/comm-bench: build it with 'cargo build --release --examples --bins'," \
    "or set BIN_DIR to the folder that has it"
fi
# Before any run: without torch there is nothing to compare with.
if ! torch_version=$("$PYTHON" -c 'import torch.distributed, torch; print(torch.__version__)' \
  2>/dev/null); then
  fail "$PYTHON cannot import torch.distributed: this script needs PyTorch (pip install torch)," \
    "or PYTHON=/path/to/python for one that has it"
fi

# Which (world size, size) pairs fit, roughly: about three buffers of the size per rank (send,
# receive and working room), and the ranks share this machine's memory.
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null || true)
plan=()
for n in "${world_sizes[@]}"; do
  for s in "${sizes[@]}"; do
    b=$(bytes_of "$s")
    if [ -n "$avail_kb" ] && [ $((3 * b * n)) -gt $((avail_kb * 1024)) ]; then
      echo "cpu-vs-gloo: skipped $s on $n ranks: 3 x size x ranks = $((3 * b * n / 1000000)) MB" \
        "is more than MemAvailable, $((avail_kb * 1024 / 1000000)) MB" >&2
      continue
    fi
    plan+=("$n $s $b")
  done
done
[ ${#plan[@]} -gt 0 ] || fail "every (size, world size) was skipped for memory: choose smaller SIZES or WORLD_SIZES"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
transport=()
[ -z "$TRANSPORT" ] || transport=(--transport "$TRANSPORT")
list=$(IFS=,; echo "${collectives[*]}")

# Ours: one comm-bench run per (world size, size), all collectives, its table on stderr. Its CSV
# is read by column name; lines "ranks size collective bytes placement median_us" go to
# $work/ours (bytes as comm-bench rounded them, so that torch times the very same buffers).
for p in "${plan[@]}"; do
  read -r n s b <<<"$p"
  csv="$work/ours-$n-$s.csv"
  "$BIN_DIR/comm-bench" --backend cpu --world-sizes "$n" -b "$b" -e "$b" --collectives "$list" \
    -n "$ITERS" -w "$WARMUP" -d float -z 1 --csv "$csv" ${transport[@]+"${transport[@]}"} >&2
  "$PYTHON" - "$csv" "$n" "$s" >>"$work/ours" <<'PY'
import csv, sys
path, ranks, size = sys.argv[1:4]
with open(path, newline="") as f:
    for row in csv.DictReader(f):
        print(ranks, size, row["collective"], row["bytes"], row["placement"], row["time_us_median"])
PY
done

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
  "$PYTHON" "$work/gloo.py" "$n" "$ITERS" "$WARMUP" "$work/theirs-$n" "${cases[@]}"
  awk -v n="$n" '{ print n, $0 }' "$work/theirs-$n" >>"$work/theirs"
done

# The table: collectives in COLLECTIVES' order, then world sizes and sizes as run.
echo "# ours: comm-bench --backend cpu${TRANSPORT:+ --transport $TRANSPORT}; Gloo: torch" \
  "$torch_version; f32, median of $ITERS iterations after $WARMUP warm-up, slowest rank's"
echo
awk -v order="$list" '
  FILENAME == ARGV[1] { theirs[$1 " " $2 " " $3] = $4; next }
  { rows[++count] = $0; us[$1 " " $2 " " $3 " " $5] = $6 }
  END {
    print "| collective | ranks | size | ours (ms) | ours compared | Gloo (ms) | Gloo / ours | ours, other placement (ms) |"
    print "|---|---:|---:|---:|---|---:|---:|---:|"
    split(order, names, ",")
    for (k = 1; names[k] != ""; k++) {
      c = names[k]
      cmp = (c == "all_reduce" || c == "broadcast") ? "in-place" : "out-of-place"
      other = (cmp == "in-place") ? "out-of-place" : "in-place"
      for (i = 1; i <= count; i++) {
        split(rows[i], f, " ")
        if (f[3] != c || f[5] != cmp) continue
        key = f[1] " " c " " f[4]
        if (!(key in theirs)) {
          printf "cpu-vs-gloo: Gloo gave no time for %s of %s bytes on %s ranks\n", c, f[4], f[1] > "/dev/stderr"
          failed = 1; continue
        }
        ratio = theirs[key] / f[6]
        o = f[1] " " f[2] " " c " " other
        printf "| %s | %s | %s | %.3f | %s | %.3f | %.2f | %s |\n", c, f[1], f[2], f[6] / 1000, cmp,
          theirs[key] / 1000, ratio, (o in us) ? sprintf("%.3f %s", us[o] / 1000, other) : "-"
        if (!(c in best) || ratio < best[c]) { best[c] = ratio; at[c] = f[2] " on " f[1] " ranks" }
      }
    }
    print ""
    for (k = 1; names[k] != ""; k++)
      if (names[k] in best)
        printf "%s: smallest Gloo / ours %.2fx (%s)\n", names[k], best[names[k]], at[names[k]]
    exit failed
  }' "$work/theirs" "$work/ours"

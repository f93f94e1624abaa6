#!/usr/bin/env bash
# Our CPU backend against Open MPI's collectives over its shared-memory transport, on this
# machine, in one go: each collective, world size and size is timed by comm-bench (--backend cpu)
# and by a small MPI program (compiled here with mpicc -O2, run with mpirun), then printed as a
# markdown table with Open MPI's time over ours, and one summary line per collective.
#
#   cargo build --release --examples --bins
#   bash scripts/cpu-vs-openmpi.sh               # BIN_DIR=target/release by default
#
# Environment (defaults in brackets):
#   BIN_DIR      where comm-bench is [target/release]
#   MPICC        Open MPI's C compiler wrapper [mpicc];  MPIRUN  its launcher [mpirun]
#   WORLD_SIZES  ranks, space-separated, each 2 or more ["2"]
#   SIZES        comm-bench's sizes: KB, MB, GB are x1000, K, M, G x1024 ["1MB 100MB"]
#   COLLECTIVES  any of all_reduce broadcast all_gather reduce_scatter [all four]
#   ITERS        timed iterations [20];  WARMUP  untimed ones before them [5]
#   TRANSPORT    passed to comm-bench as --transport (auto, shm, tcp) when set; else its default
# Size means what comm-bench means: the whole buffer, i.e. the gathered output of all_gather and
# the input of reduce_scatter (world size x the per-rank piece). A (size, world size) whose
# buffers would not fit (3 x size x world size over MemAvailable) is skipped, with a line on stderr.
#
# Both sides time alike: f32, warm-up, then per iteration a barrier and one call; an iteration's
# time is the slowest rank's (MPI_MAX over ranks after the loop); the median is reported, the
# lower middle one for an even count as comm-bench -z 1 does. The MPI calls: MPI_Allreduce
# (MPI_IN_PLACE, MPI_SUM) and MPI_Bcast (root 0) work in place, so our in-place time is compared;
# MPI_Allgather and MPI_Reduce_scatter_block (MPI_SUM) out of place, so our out-of-place time is.
# Our other placement is shown beside it for information. Open MPI runs with
#   mpirun --allow-run-as-root --oversubscribe --bind-to none -np N --mca pml ob1 --mca btl self,SM
# where SM is Open MPI 4's shared-memory BTL, vader, or Open MPI 5's, sm (chosen by
# mpirun --version); pml ob1 so that the BTLs named are the ones used (UCX's pml would bypass
# them). Its collective algorithms are its defaults (coll tuned). The script installs nothing:
# without mpicc and mpirun it says how to get them (apt-get install openmpi-bin libopenmpi-dev).
set -euo pipefail
here=$(dirname "$0")

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
for arg in "$@"; do
  case $arg in
    -h | --help) usage; exit 0 ;;
    *)
      echo "cpu-vs-openmpi: unknown argument '$arg': the script takes none but -h/--help;" \
        "settings are environment variables (see --help)" >&2
      exit 2 ;;
  esac
done

cd "$here/.."
BIN_DIR=${BIN_DIR:-target/release}
MPICC=${MPICC:-mpicc}
MPIRUN=${MPIRUN:-mpirun}
WORLD_SIZES=${WORLD_SIZES:-2}
SIZES=${SIZES:-1MB 100MB}
COLLECTIVES=${COLLECTIVES:-all_reduce broadcast all_gather reduce_scatter}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
TRANSPORT=${TRANSPORT:-}

fail() { echo "cpu-vs-openmpi: $*" >&2; exit 2; }

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

# Knobs first: a typo is reported at once, whatever MPI is at hand. (Lists are read into arrays,
# so that a '*' in one is not expanded as a file name.)
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
ITERS=$((10#$ITERS)) WARMUP=$((10#$WARMUP))
# A name given twice is run once.
unique() { awk '!seen[$0]++'; }
mapfile -t collectives < <(printf '%s\n' "${asked[@]}" | unique)
mapfile -t world_sizes < <(printf '%s\n' "${world_sizes[@]}" | unique)
mapfile -t sizes < <(printf '%s\n' "${sizes[@]}" | unique)

if [ ! -x "$BIN_DIR/comm-bench" ]; then
  fail "no $BIN_DIR/comm-bench: build it with 'cargo build --release --examples --bins'," \
    "or set BIN_DIR to the folder that has it"
fi
# Before any run: without Open MPI there is nothing to compare with.
missing=
command -v "$MPICC" >/dev/null 2>&1 || missing=$MPICC
command -v "$MPIRUN" >/dev/null 2>&1 || missing="${missing:+$missing and }$MPIRUN"
if [ -n "$missing" ]; then
  fail "cannot find $missing: this script needs Open MPI's mpicc and mpirun" \
    "(apt-get install openmpi-bin libopenmpi-dev), or MPICC= and MPIRUN= naming them"
fi
# Open MPI 4 calls its shared-memory BTL vader, Open MPI 5 sm; another MPI's mpirun has no --mca.
mpi_about=$("$MPIRUN" --version 2>&1 || true)
if ! [[ $mpi_about =~ \(Open\ MPI\)\ ([0-9]+)(\.[0-9.]+)? ]]; then
  fail "$MPIRUN is not Open MPI's mpirun (its --version says '$(head -n 1 <<<"$mpi_about")'):" \
    "install Open MPI (apt-get install openmpi-bin libopenmpi-dev), or MPIRUN= naming its mpirun"
fi
mpi_version=${BASH_REMATCH[1]}${BASH_REMATCH[2]}
if [ "${BASH_REMATCH[1]}" -ge 5 ]; then shm_btl=sm; else shm_btl=vader; fi

# Which (world size, size) pairs fit, roughly: about three buffers of the size per rank (send,
# receive and working room), and the ranks share this machine's memory.
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null || true)
plan=()
for n in "${world_sizes[@]}"; do
  for s in "${sizes[@]}"; do
    b=$(bytes_of "$s")
    if [ -n "$avail_kb" ] && [ $((3 * b * n)) -gt $((avail_kb * 1024)) ]; then
      echo "cpu-vs-openmpi: skipped $s on $n ranks: 3 x size x ranks = $((3 * b * n / 1000000)) MB" \
        "is more than MemAvailable, $((avail_kb * 1024 / 1000000)) MB" >&2
      continue
    fi
    plan+=("$n $s $b")
  done
done
[ ${#plan[@]} -gt 0 ] || fail "every (size, world size) was skipped for memory: choose smaller SIZES or WORLD_SIZES"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Theirs, compiled before anything runs (a broken mpicc is reported at once): for each
# "collective:bytes" argument, WARMUP untimed calls, then ITERS times a barrier and one timed
# call; each iteration's slowest rank (MPI_MAX) after the loop; rank 0 writes
# "collective bytes median_us" lines to the file named by its first argument.
cat >"$work/mpi-bench.c" <<'C'
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, world;

static void die(const char *what, const char *arg) {
  fprintf(stderr, "cpu-vs-openmpi: mpi-bench on rank %d: %s%s\n", rank, what, arg);
  MPI_Abort(MPI_COMM_WORLD, 3);
}

static int earlier(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* count floats, every page written before the first call times anything. */
static float *ones(size_t count) {
  float *p = malloc((count ? count : 1) * sizeof *p);
  if (!p) die("out of memory", "");
  for (size_t i = 0; i < count; i++) p[i] = 1.0f;
  return p;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 4) die("usage: mpi-bench OUT ITERS WARMUP collective:bytes...", "");
  long iters = atol(argv[2]), warmup = atol(argv[3]);
  if (iters < 1 || warmup < 0) die("bad ITERS or WARMUP", "");
  double *times = malloc(iters * sizeof *times), *slowest = malloc(iters * sizeof *slowest);
  if (!times || !slowest) die("out of memory", "");
  FILE *out = NULL;
  if (rank == 0 && !(out = fopen(argv[1], "w"))) die("cannot write ", argv[1]);
  for (int a = 4; a < argc; a++) {
    char name[32];
    unsigned long long bytes;
    if (sscanf(argv[a], "%31[a-z_]:%llu", name, &bytes) != 2) die("bad case ", argv[a]);
    /* comm-bench's bytes are the whole buffer; the per-rank piece is 1/world of it. */
    unsigned long long whole = bytes / 4, piece = whole / world;
    if (whole > INT_MAX) die("more than INT_MAX floats in one call: ", argv[a]);
    int kind = !strcmp(name, "all_reduce")       ? 0
               : !strcmp(name, "broadcast")      ? 1
               : !strcmp(name, "all_gather")     ? 2
               : !strcmp(name, "reduce_scatter") ? 3
                                                 : -1;
    if (kind < 0) die("unknown collective ", name);
    float *big = ones(kind < 2 ? whole : piece * world), *small = kind < 2 ? NULL : ones(piece);
    for (long i = -warmup; i < iters; i++) {
      if (i >= 0) MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      switch (kind) {
      case 0: MPI_Allreduce(MPI_IN_PLACE, big, (int)whole, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
      case 1: MPI_Bcast(big, (int)whole, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
      case 2:
        MPI_Allgather(small, (int)piece, MPI_FLOAT, big, (int)piece, MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case 3:
        MPI_Reduce_scatter_block(big, small, (int)piece, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      }
      if (i >= 0) times[i] = MPI_Wtime() - t0;
    }
    MPI_Reduce(times, slowest, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      qsort(slowest, iters, sizeof *slowest, earlier);
      fprintf(out, "%s %llu %.3f\n", name, bytes, slowest[(iters - 1) / 2] * 1e6);
    }
    free(big);
    free(small);
  }
  if (out && fclose(out) != 0) die("cannot write ", argv[1]);
  MPI_Finalize();
  return 0;
}
C
if ! "$MPICC" -O2 -o "$work/mpi-bench" "$work/mpi-bench.c" >&2; then
  fail "$MPICC -O2 could not compile the MPI benchmark (its messages are above): is" \
    "libopenmpi-dev installed?"
fi

transport=()
[ -z "$TRANSPORT" ] || transport=(--transport "$TRANSPORT")
list=$(IFS=,; echo "${collectives[*]}")

# Ours: one comm-bench run per (world size, size), all collectives, its table on stderr. Its CSV
# is read by column name (a quoted field may hold commas: the machine's name); lines
# "ranks size collective bytes placement median_us" go to $work/ours (bytes as comm-bench rounded
# them, so that MPI times the very same buffers).
for p in "${plan[@]}"; do
  read -r n s b <<<"$p"
  csv="$work/ours-$n-$s.csv"
  "$BIN_DIR/comm-bench" --backend cpu --world-sizes "$n" -b "$b" -e "$b" --collectives "$list" \
    -n "$ITERS" -w "$WARMUP" -d float -z 1 --csv "$csv" ${transport[@]+"${transport[@]}"} >&2
  awk -v ranks="$n" -v size="$s" '
    function fields(line, out,   i, c, n, field, quoted) {
      n = 0; field = ""; quoted = 0
      for (i = 1; i <= length(line); i++) {
        c = substr(line, i, 1)
        if (quoted) {
          if (c != "\"") field = field c
          else if (substr(line, i + 1, 1) == "\"") { field = field c; i++ }
          else quoted = 0
        } else if (c == "\"") quoted = 1
        else if (c == ",") { out[++n] = field; field = "" }
        else field = field c
      }
      out[++n] = field
      return n
    }
    { sub(/\r$/, "") }
    NR == 1 {
      for (i = fields($0, head); i > 0; i--) col[head[i]] = i
      split("collective bytes placement time_us_median", need, " ")
      for (k = 1; k <= 4; k++)
        if (!(need[k] in col)) {
          printf "cpu-vs-openmpi: comm-bench'"'"'s CSV %s has no column %s\n", FILENAME, need[k] > "/dev/stderr"
          exit 1
        }
      next
    }
    {
      fields($0, f)
      print ranks, size, f[col["collective"]], f[col["bytes"]], f[col["placement"]], f[col["time_us_median"]]
    }' "$csv" >>"$work/ours"
done

# Theirs: one mpirun per world size timing every (collective, bytes) we timed there.
for n in "${world_sizes[@]}"; do
  mapfile -t cases < <(awk -v n="$n" '$1 == n { print $3 ":" $4 }' "$work/ours" | sort -u)
  [ ${#cases[@]} -gt 0 ] || continue
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$MPIRUN" --allow-run-as-root \
    --oversubscribe --bind-to none -np "$n" --mca pml ob1 --mca btl "self,$shm_btl" \
    "$work/mpi-bench" "$work/theirs-$n" "$ITERS" "$WARMUP" "${cases[@]}" >&2
  awk -v n="$n" '{ print n, $0 }' "$work/theirs-$n" >>"$work/theirs"
done

# The table: collectives in COLLECTIVES' order, then world sizes and sizes as run.
echo "# ours: comm-bench --backend cpu${TRANSPORT:+ --transport $TRANSPORT}; OpenMPI:" \
  "Open MPI $mpi_version, pml ob1, btl self,$shm_btl, default collectives; f32, median of" \
  "$ITERS iterations after $WARMUP warm-up, slowest rank's"
echo
awk -v order="$list" '
  FILENAME == ARGV[1] { theirs[$1 " " $2 " " $3] = $4; next }
  { rows[++count] = $0; us[$1 " " $2 " " $3 " " $5] = $6 }
  END {
    print "| collective | ranks | size | ours (ms) | ours compared | OpenMPI (ms) | OpenMPI / ours | ours, other placement (ms) |"
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
          printf "cpu-vs-openmpi: OpenMPI gave no time for %s of %s bytes on %s ranks\n", c, f[4], f[1] > "/dev/stderr"
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
        printf "%s: smallest OpenMPI / ours %.2fx (%s)\n", names[k], best[names[k]], at[names[k]]
    exit failed
  }' "$work/theirs" "$work/ours"

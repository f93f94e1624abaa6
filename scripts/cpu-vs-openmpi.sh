#!/usr/bin/env bash
# Our CPU backend against Open MPI's collectives over its shared-memory transport, on this
# machine, in one go: each collective, world size and size is timed by comm-bench (--backend cpu)
# and by a small MPI program (compiled here with mpicc -O2, run with mpirun), then printed as a
# markdown table with Open MPI's time over ours, and one summary line per collective.
#
#   cargo build --release
#   bash scripts/cpu-vs-openmpi.sh               # BIN_DIR=target/release by default
#
# Environment (defaults in brackets):
#   BIN_DIR      where comm-bench is [target/release]
#   MPICC        Open MPI's C compiler wrapper [mpicc];  MPIRUN  its launcher [mpirun]
#   WORLD_SIZES  ranks, space-separated, each 2 or more ["2"]; more ranks than cores (e.g. "8 16
#                32" on a 2-core laptop) run oversubscribed on both sides, Open MPI's ranks yielding
#                when idle (mpirun --oversubscribe), ours sleeping
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
# upper middle one for an even count as comm-bench -z 3's time_us_median (nccl-tests' p50). The MPI calls: MPI_Allreduce
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

peer_script=cpu-vs-openmpi
# shellcheck source=scripts/peer-bench.sh
. "$here/peer-bench.sh"
take_no_arguments "$@"

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

check_knobs
ITERS=$((10#$ITERS)) WARMUP=$((10#$WARMUP))
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

plan_runs

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Theirs, compiled before anything runs (a broken mpicc is reported at once): for each
# "collective:bytes" argument, WARMUP untimed calls, then ITERS times a barrier and one timed
# call; each iteration's slowest rank (MPI_MAX) after the loop, in both placements; rank 0 writes
# "collective bytes median_us other_placement_median_us" lines to the file named by its first
# argument, and the median memcpy of the case's bytes on rank 0 (the one-copy bound).
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

/* The median over ITERS iterations (each the slowest rank's, after a barrier) of one call of
   collective `kind` in place or not, after WARMUP untimed calls. Out of place, all_reduce writes
   a second buffer and broadcast's root copies its input into the one it broadcasts (MPI has no
   out-of-place broadcast: that copy is what a caller adds); in place, all_gather and
   reduce_scatter take MPI_IN_PLACE. */
static double median_us(int kind, int in_place, unsigned long long whole, unsigned long long piece,
                        long iters, long warmup, double *times, double *slowest) {
  float *big = ones(kind < 2 ? whole : piece * world);
  float *other = kind < 2 ? (in_place ? NULL : ones(whole)) : (in_place ? NULL : ones(piece));
  for (long i = -warmup; i < iters; i++) {
    if (i >= 0) MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    switch (kind * 2 + in_place) {
    case 0: MPI_Allreduce(big, other, (int)whole, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case 1: MPI_Allreduce(MPI_IN_PLACE, big, (int)whole, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case 2:
      if (rank == 0) memcpy(other, big, whole * sizeof *big);
      MPI_Bcast(other, (int)whole, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    case 3: MPI_Bcast(big, (int)whole, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
    case 4:
      MPI_Allgather(other, (int)piece, MPI_FLOAT, big, (int)piece, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case 5:
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, big, (int)piece, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case 6: MPI_Reduce_scatter_block(big, other, (int)piece, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case 7:
      MPI_Reduce_scatter_block(MPI_IN_PLACE, big, (int)piece, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    }
    if (i >= 0) times[i] = MPI_Wtime() - t0;
  }
  MPI_Reduce(times, slowest, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  free(big);
  free(other);
  if (rank != 0) return 0;
  qsort(slowest, iters, sizeof *slowest, earlier);
  return slowest[iters / 2] * 1e6;
}

/* The one-copy bound: the median of ITERS memcpy calls of `whole` floats on this core, after
   WARMUP untimed ones (the pages are written before, as the collectives' are). */
static double memcpy_us(unsigned long long whole, long iters, long warmup, double *times) {
  float *from = ones(whole), *to = ones(whole);
  for (long i = -warmup; i < iters; i++) {
    double t0 = MPI_Wtime();
    memcpy(to, from, whole * sizeof *to);
    if (i >= 0) times[i] = MPI_Wtime() - t0;
  }
  free(from);
  free(to);
  qsort(times, iters, sizeof *times, earlier);
  return times[iters / 2] * 1e6;
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
    /* Both placements: the compared one (ours is compared at it) first, then the other. */
    double compared = median_us(kind, kind < 2, whole, piece, iters, warmup, times, slowest);
    double other = median_us(kind, kind >= 2, whole, piece, iters, warmup, times, slowest);
    if (rank == 0)
      fprintf(out, "%s %llu %.3f %.3f %.3f\n", name, bytes, compared, other,
              memcpy_us(whole, iters, warmup, times));
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

load_before=$(cut -d ' ' -f 1 /proc/loadavg)
run_ours

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
  "$ITERS iterations after $WARMUP warm-up, slowest rank's; $(nproc) cores, load average" \
  "$load_before before the runs, $(cut -d ' ' -f 1 /proc/loadavg) after"
echo
print_table OpenMPI

# The one-copy bound: no way of moving the bytes between two processes beats one memcpy of them
# (rank 0's, timed after the collectives of the same size, in the same run).
echo
echo "| collective | ranks | size | placement | ours (ms) | memcpy of the bytes (ms) | ours / memcpy |"
echo "|---|---:|---:|---|---:|---:|---:|"
awk -v order="$list" '
  FILENAME == ARGV[1] { copy[$1 " " $2 " " $3] = $6; next }
  { rows[++count] = $0 }
  END {
    split(order, names, ",")
    for (k = 1; names[k] != ""; k++)
      for (i = 1; i <= count; i++) {
        split(rows[i], f, " ")
        key = f[1] " " f[3] " " f[4]
        if (f[3] != names[k] || !(key in copy) || copy[key] <= 0) continue
        printf "| %s | %s | %s | %s | %.3f | %.3f | %.2f |\n", f[3], f[1], f[2], f[5], f[6] / 1000,
          copy[key] / 1000, f[6] / copy[key]
      }
  }' "$work/theirs" "$work/ours"

# What out of place costs over in place, on both sides: a copy that only one side paid for would
# show here. The last column bounds it: out of place against in place plus one memcpy of the
# case's bytes (at most what a caller copying the result out would add).
echo
echo "| collective | ranks | size | ours out / in place | OpenMPI out / in place | ours out / (in place + memcpy) |"
echo "|---|---:|---:|---:|---:|---:|"
awk -v order="$list" '
  FILENAME == ARGV[1] {
    in_place = ($2 == "all_reduce" || $2 == "broadcast")
    out_us[$1 " " $2 " " $3] = in_place ? $5 : $4
    in_us[$1 " " $2 " " $3] = in_place ? $4 : $5
    copy[$1 " " $2 " " $3] = $6
    next
  }
  {
    ours[$1 " " $2 " " $3 " " $5] = $6
    if (!(($1 " " $2 " " $3) in key)) rows[++count] = $1 " " $2 " " $3
    key[$1 " " $2 " " $3] = $1 " " $3 " " $4
  }
  END {
    split(order, names, ",")
    for (k = 1; names[k] != ""; k++)
      for (n = 1; n <= count; n++) {
        row = rows[n]
        split(row, r, " ")
        if (r[3] != names[k]) continue
        theirs = key[row]
        o = ours[row " out-of-place"]; i = ours[row " in-place"]
        if (!(theirs in in_us) || !o || !i || !in_us[theirs]) continue
        printf "| %s | %s | %s | %.2f | %.2f | %.2f |\n", r[3], r[1], r[2], o / i,
          out_us[theirs] / in_us[theirs], o / (i + copy[theirs])
      }
  }' "$work/theirs" "$work/ours"

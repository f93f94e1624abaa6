#!/usr/bin/env bash
# Two costs of our CPU backend, measured on this machine in one go, each against its goal:
#
#  - placement: out of place may cost at most the one local copy that in place does not make:
#    out-of-place time <= 1.2 x (in-place time + a memcpy of the bytes it must copy locally: the
#    whole buffer for all_reduce, broadcast and reduce, a rank's block for all_gather,
#    reduce_scatter, alltoall, gather and scatter; timed as many at once as ranks run at once,
#    since every rank makes its copy at the same moment), -z 3 medians, every world size;
#  - pacing: calls back to back (-z 0) cost at most 1.2 x one call at a time (-z 3, mean per
#    call), on the smallest world size.
#
#   cargo build --release
#   bash scripts/placement-and-pacing.sh         # BIN_DIR=target/release by default
#
# Environment (defaults in brackets):
#   BIN_DIR      where comm-bench is [target/release];  CC  a C compiler for the memcpy timer [cc]
#   WORLD_SIZES  ranks, space-separated, each 2 or more ["2 4"]
#   MIN, MAX, FACTOR  the sizes, as comm-bench's -b, -e, -f ["8", "64M", "2"]
#   COLLECTIVES  comm-bench's --collectives ["all"]
#   ITERS        timed iterations [20];  WARMUP  untimed ones before them [5]
# Prints two markdown tables, one row per (collective, ranks, size), a row that misses its goal
# marked "over", then one line counting them. Exit status 0 whatever was measured: speed is
# reported here, never asserted by a test.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-target/release}
CC=${CC:-cc}
WORLD_SIZES=${WORLD_SIZES:-2 4}
MIN=${MIN:-8} MAX=${MAX:-64M} FACTOR=${FACTOR:-2}
COLLECTIVES=${COLLECTIVES:-all}
ITERS=${ITERS:-20} WARMUP=${WARMUP:-5}

fail() { echo "placement-and-pacing: $*" >&2; exit 2; }
for arg in "$@"; do
  case $arg in
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) fail "unknown argument '$arg': settings are environment variables (see --help)" ;;
  esac
done
[ -x "$BIN_DIR/comm-bench" ] || fail "no $BIN_DIR/comm-bench: build it with 'cargo build --release'"
command -v "$CC" >/dev/null || fail "no C compiler '$CC' for the memcpy timer (apt-get install gcc, or CC=)"
read -ra world_sizes <<<"$WORLD_SIZES"
[ ${#world_sizes[@]} -gt 0 ] || fail "WORLD_SIZES is empty"
for n in "${world_sizes[@]}"; do
  [[ $n =~ ^[0-9]{1,3}$ ]] && [ "$n" -ge 2 ] || fail "world size '$n': use whole numbers of 2 or more"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# comm-bench's rows, read from its CSV by column name: "ranks collective bytes placement
# median_us mean_us" per line in $work/z3 (one call at a time) and $work/z0 (back to back).
sweep() { # sweep BLOCKING N OUT
  "$BIN_DIR/comm-bench" --backend cpu --world-sizes "$2" -b "$MIN" -e "$MAX" -f "$FACTOR" \
    --collectives "$COLLECTIVES" -n "$ITERS" -w "$WARMUP" -z "$1" --csv "$work/csv" >&2 ||
    fail "comm-bench failed (its messages are above)"
  awk -F, -v n="$2" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    { print n, $col["collective"], $col["bytes"], $col["placement"], $col["time_us_median"], $col["time_us"] }
  ' "$work/csv" >>"$3"
}
for n in "${world_sizes[@]}"; do sweep 3 "$n" "$work/z3"; done
smallest=$(printf '%s\n' "${world_sizes[@]}" | sort -n | head -n 1)
sweep 0 "$smallest" "$work/z0"

# The bytes each out-of-place row must copy locally, and a memcpy of them timed here (median of
# 51 after 5 untimed, the pages written first).
awk '
  $2 ~ /^(all_reduce|broadcast|reduce)$/ { print $3; next }
  { print int($3 / $1) }' "$work/z3" | sort -un >"$work/copies"
cat >"$work/memcpy.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static int earlier(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
int main(void) {
  unsigned long long bytes;
  double t[51];
  while (scanf("%llu", &bytes) == 1) {
    char *from = malloc(bytes + 1), *to = malloc(bytes + 1);
    if (!from || !to) return 1;
    memset(from, 1, bytes + 1);
    memset(to, 2, bytes + 1);
    for (int i = -5; i < 51; i++) {
      struct timespec a, b;
      clock_gettime(CLOCK_MONOTONIC, &a);
      memcpy(to, from, bytes);
      __asm__ __volatile__("" : : "r"(to) : "memory");
      clock_gettime(CLOCK_MONOTONIC, &b);
      if (i >= 0) t[i] = (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
    }
    qsort(t, 51, sizeof *t, earlier);
    printf("%llu %.3f\n", bytes, t[25]);
    free(from);
    free(to);
  }
  return 0;
}
C
"$CC" -O2 -o "$work/memcpy" "$work/memcpy.c" || fail "$CC could not compile the memcpy timer"
# The ranks make their local copies at the same moment, sharing the memory bus: the memcpy is
# timed as many at once as the ranks that run at once (a rank per core at most), the slowest
# one's median kept. Lines "copies_at_once bytes us" in $work/memcpy-us.
cores=$(nproc)
for n in "${world_sizes[@]}"; do
  at_once=$((n < cores ? n : cores))
  grep -q "^$at_once " "$work/memcpy-us" 2>/dev/null && continue
  for ((k = 0; k < at_once; k++)); do "$work/memcpy" <"$work/copies" >"$work/memcpy-$k" & done
  wait
  cat "$work"/memcpy-[0-9]* | awk -v c="$at_once" '$2 > us[$1] { us[$1] = $2 } END { for (b in us) print c, b, us[b] }' >>"$work/memcpy-us"
  rm -f "$work"/memcpy-[0-9]*
done

echo "# comm-bench --backend cpu -z 3, median of $ITERS after $WARMUP warm-up; memcpy: median of" \
  "51, as many at once as ranks run at once (at most $cores, this machine's cores), the slowest's"
echo
echo "| collective | ranks | size (B) | in place (µs) | out of place (µs) | local copy (B) | memcpy (µs) | out / (in + memcpy) | goal ≤ 1.2 |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
awk -v cores="$cores" -v summary="$work/placement-summary" '
  FILENAME == ARGV[1] { copy_us[$1 " " $2] = $3; next }
  {
    key = $1 " " $2 " " $3
    if (!(key in seen)) { seen[key] = 1; rows[++count] = key }
    us[key " " $4] = $5
  }
  END {
    for (i = 1; i <= count; i++) {
      split(rows[i], f, " ")
      o = us[rows[i] " out-of-place"]; p = us[rows[i] " in-place"]
      if (o == "" || p == "") continue
      copied = (f[2] ~ /^(all_reduce|broadcast|reduce)$/) ? f[3] : int(f[3] / f[1])
      c = copy_us[((f[1] < cores) ? f[1] : cores) " " copied]
      ratio = o / (p + c)
      over = ratio > 1.2
      misses += over
      printf "| %s | %s | %s | %.2f | %.2f | %s | %.3f | %.2f | %s |\n", f[2], f[1], f[3], p, o, copied,
        c, ratio, over ? "over" : "ok"
    }
    printf "placement: %d of the rows above over 1.2\n", misses > summary
  }' "$work/memcpy-us" "$work/z3"

echo
echo "# $smallest ranks: -z 0 (back to back, mean per call) against -z 3 (one at a time, mean per call)"
echo
echo "| collective | placement | size (B) | one at a time (µs) | back to back (µs) | back to back / one at a time | goal ≤ 1.2 |"
echo "|---|---|---:|---:|---:|---:|---|"
awk -v n="$smallest" -v summary="$work/pacing-summary" '
  FILENAME == ARGV[1] { if ($1 == n) alone[$2 " " $4 " " $3] = $6; next }
  {
    key = $2 " " $4 " " $3
    if (!(key in alone) || alone[key] <= 0) next
    ratio = $6 / alone[key]
    over = ratio > 1.2
    misses += over
    printf "| %s | %s | %s | %.2f | %.2f | %.2f | %s |\n", $2, $4, $3, alone[key], $6, ratio, over ? "over" : "ok"
  }
  END { printf "pacing: %d of the rows above over 1.2\n", misses > summary }
' "$work/z3" "$work/z0"
echo
cat "$work/placement-summary" "$work/pacing-summary"

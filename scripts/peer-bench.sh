# shellcheck shell=bash
# shellcheck disable=SC2153,SC2154 # the knobs, peer_script and $work are the sourcing script's
# What scripts/cpu-vs-gloo.sh and scripts/cpu-vs-openmpi.sh share, sourced by both: comm-bench's
# size syntax, the knobs (WORLD_SIZES, SIZES, COLLECTIVES, ITERS, WARMUP, TRANSPORT, BIN_DIR), the
# (world size, size) pairs that fit in memory, our side of the run (comm-bench, its CSV read by
# column name into $work/ours) and the table, and the refusal of arguments. The sourcing script
# sets peer_script (its name, for messages) before sourcing, and the knobs' defaults before
# check_knobs.

fail() { echo "$peer_script: $*" >&2; exit 2; }

# take_no_arguments "$@": -h/--help prints the sourcing script's header comment; any other
# argument is refused, since the settings are environment variables.
take_no_arguments() {
  local arg
  for arg in "$@"; do
    case $arg in
      -h | --help)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
        exit 0 ;;
      *) fail "unknown argument '$arg': the script takes none but -h/--help; settings are" \
        "environment variables (see --help)" ;;
    esac
  done
}

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

# check_knobs: every knob checked, a typo reported at once, before anything runs; sets the
# arrays collectives, world_sizes and sizes. (Lists are read into arrays, so that a '*' in one is
# not expanded as a file name.) Then comm-bench must be there.
check_knobs() {
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
    fail "no $BIN_DIR/comm-bench: build it with 'cargo build --release'," \
      "or set BIN_DIR to the folder that has it"
  fi
}

# plan_runs: the (world size, size) pairs that fit, roughly, as "ranks size bytes" in plan.
plan_runs() {
  # Which (world size, size) pairs fit, roughly: about three buffers of the size per rank (send,
  # receive and working room), and the ranks share this machine's memory.
  avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null || true)
  plan=()
  for n in "${world_sizes[@]}"; do
    for s in "${sizes[@]}"; do
      b=$(bytes_of "$s")
      if [ -n "$avail_kb" ] && [ $((3 * b * n)) -gt $((avail_kb * 1024)) ]; then
        echo "$peer_script: skipped $s on $n ranks: 3 x size x ranks = $((3 * b * n / 1000000)) MB" \
          "is more than MemAvailable, $((avail_kb * 1024 / 1000000)) MB" >&2
        continue
      fi
      plan+=("$n $s $b")
    done
  done
  [ ${#plan[@]} -gt 0 ] || fail "every (size, world size) was skipped for memory: choose smaller SIZES or WORLD_SIZES"
  # Said before the first run: with the default sizes (up to 1 GB) this takes minutes.
  echo "$peer_script: ${#plan[@]} (world size, size) pairs, timed by comm-bench, then by the peer:" \
    "minutes with sizes up to 1GB (more than 4 on a 2-core laptop); SIZES=\"1MB 10MB\" is quicker" >&2
}

# run_ours: one comm-bench run per planned pair, all collectives; lines "ranks size collective
# bytes placement median_us" go to $work/ours (bytes as comm-bench rounded them, so that the peer
# times the very same buffers).
run_ours() {
  transport=()
  [ -z "$TRANSPORT" ] || transport=(--transport "$TRANSPORT")
  list=$(IFS=,; echo "${collectives[*]}")
  # comm-bench's table goes to stderr; its CSV is read by column name (a quoted field may hold
  # commas: the machine's name).
  local k=0
  for p in "${plan[@]}"; do
    read -r n s b <<<"$p"
    k=$((k + 1))
    echo "$peer_script: ours, $s on $n ranks ($k of ${#plan[@]})" >&2
    csv="$work/ours-$n-$s.csv"
    "$BIN_DIR/comm-bench" --backend cpu --world-sizes "$n" -b "$b" -e "$b" --collectives "$list" \
      -n "$ITERS" -w "$WARMUP" -d float -z 3 --csv "$csv" ${transport[@]+"${transport[@]}"} >&2
    awk -v ranks="$n" -v size="$s" -v script="$peer_script" '
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
            printf "%s: comm-bench'"'"'s CSV %s has no column %s\n", script, FILENAME, need[k] > "/dev/stderr"
            exit 1
          }
        next
      }
      {
        fields($0, f)
        print ranks, size, f[col["collective"]], f[col["bytes"]], f[col["placement"]], f[col["time_us_median"]]
      }' "$csv" >>"$work/ours"
  done
}

# print_table PEER: ours against $work/theirs ("ranks collective bytes median_us" lines), in
# COLLECTIVES' order; one summary line per collective.
print_table() {
  awk -v order="$list" -v peer="$1" -v script="$peer_script" '
    FILENAME == ARGV[1] { theirs[$1 " " $2 " " $3] = $4; next }
    { rows[++count] = $0; us[$1 " " $2 " " $3 " " $5] = $6 }
    END {
      printf "| collective | ranks | size | ours (ms) | ours compared | %s (ms) | %s / ours | ours, other placement (ms) |\n", peer, peer
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
            printf "%s: %s gave no time for %s of %s bytes on %s ranks\n", script, peer, c, f[4], f[1] > "/dev/stderr"
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
          printf "%s: smallest %s / ours %.2fx (%s)\n", names[k], peer, best[names[k]], at[names[k]]
      exit failed
    }' "$work/theirs" "$work/ours"
}

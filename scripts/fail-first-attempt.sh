#!/usr/bin/env bash
# fail-first-attempt.sh PROGRAM [ARGS...] - a worker that fails once, to watch torchrun restart
# a worker group (its --max-restarts):
#
#   torchrun --standalone --nproc_per_node=4 --max-restarts 2 --no-python \
#       scripts/fail-first-attempt.sh target/release/01-broadcast
#
# On the group's first attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 says so and exits 1;
# torchrun stops the other ranks and starts all four again with TORCHELASTIC_RESTART_COUNT=1,
# and this time every rank runs PROGRAM (rank 1 saying which attempt it runs on). The restarted ranks meet under fresh keys of torchrun's
# store (/worker/attempt_1), so nothing the first attempt wrote gets in their way.

set -euo pipefail
[[ $# -ge 1 ]] || { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }
attempt=${TORCHELASTIC_RESTART_COUNT:-0}
if [[ ${RANK:-} == 1 ]]; then
    if [[ $attempt == 0 ]]; then
        echo "fail-first-attempt.sh: rank 1 fails on attempt 0 (TORCHELASTIC_RESTART_COUNT=0)" >&2
        exit 1
    fi
    echo "fail-first-attempt.sh: rank 1 runs on attempt $attempt (TORCHELASTIC_RESTART_COUNT=$attempt)" >&2
fi
exec "$@"

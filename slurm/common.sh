# slurm/common.sh - what every script of slurm/ does first. Sourced from the job's script
# (`source "$SLURM_SUBMIT_DIR/slurm/common.sh"`), so submit from the repository root.
#
#   MODULES  what `module load` gets    (default "cuda nccl": the site's default versions;
#            MODULES= loads nothing)
#   BIN_DIR  where the build is          (default $SLURM_SUBMIT_DIR/target/release)
#   OUT_DIR  where files a job writes go (default under $SCRATCH, else under $WORK, else
#            $SLURM_SUBMIT_DIR/results: reports and CSVs are large, $HOME is small)
# shellcheck shell=bash

# The one build command (README.md): the examples, commrun and comm-bench in target/release.
BUILD_COMMAND="cargo build --release"
BIN_DIR=${BIN_DIR:-$SLURM_SUBMIT_DIR/target/release}

# CUDA and NCCL (the NCCL backend loads libnccl.so at run time). A failed load ends the job
# with what went wrong, instead of `set -e` ending it without a word.
load_modules() {
    local modules=${MODULES-cuda nccl}
    [[ -n $modules ]] || return 0
    if ! command -v module >/dev/null 2>&1; then
        echo "note: no \`module\` command on $(hostname): not loading $modules" >&2
        return 0
    fi
    # shellcheck disable=SC2086
    if ! module load $modules; then
        echo "error: \`module load $modules\` failed (what module said is above)." >&2
        echo "       \`module avail cuda nccl\` lists what this site has; choose with" >&2
        echo "       MODULES=\"cuda/<version> nccl/<version>\" sbatch ..., or MODULES= to load nothing." >&2
        exit 1
    fi
}

# Stops the job with the build command when a program is missing.
need_program() {
    if [[ ! -x $1 ]]; then
        echo "error: $1 not found: build first, from the repository root: $BUILD_COMMAND" >&2
        echo "       (slurm/README.md: building on Leonardo; or set BIN_DIR)" >&2
        exit 1
    fi
}

# The folder for what job KIND writes: OUT_DIR, else $SCRATCH/nccl-workshop/KIND-JOBID, ...
out_dir() {
    local base
    if [[ -n ${SCRATCH:-} ]]; then
        base=$SCRATCH/nccl-workshop
    elif [[ -n ${WORK:-} ]]; then
        base=$WORK/$USER/nccl-workshop
    else
        base=$SLURM_SUBMIT_DIR/results
    fi
    echo "${OUT_DIR:-$base/$1-$SLURM_JOB_ID}"
}

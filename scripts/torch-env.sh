#!/usr/bin/env bash
# torch-env.sh - the PyTorch the tests run our programs under (torchrun, torch.distributed).
#
# One virtual environment, kept outside the clone so that a machine downloads torch (the CUDA
# wheel: about 5 GB, which imports fine on a machine without a GPU) once, not per clone:
#
#   ${NCCL_WORKSHOP_TORCH_VENV:-~/.cache/nccl-workshop/torch-venv}
#
# Usage:
#   scripts/torch-env.sh install   # python3 -m venv + pip install torch==2.15.0, only if its
#                                  # bin/torchrun is missing (about a minute on a fast network),
#                                  # and numpy if it is missing
#   scripts/torch-env.sh dir       # prints the environment's folder (what the tests read)
#
# Then, for example:
#   "$(scripts/torch-env.sh dir)/bin/torchrun" --standalone --nproc_per_node=4 \
#       --no-python target/release/01-broadcast
#
# The tests (crates/test-support/src/torch.rs) find torch through `dir`, and skip saying so where
# bin/torchrun is missing, unless NCCL_WORKSHOP_REQUIRE_TORCH=1 (as .ci/run sets), where that is
# a failure.

set -euo pipefail

PROG=${0##*/}
TORCH_VERSION=2.15.0
VENV=${NCCL_WORKSHOP_TORCH_VENV:-$HOME/.cache/nccl-workshop/torch-venv}

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
    sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}

cmd_install() {
    if [[ -x $VENV/bin/torchrun ]]; then
        log "torch already installed in $VENV"
    else
        install_torch
    fi
    # Without NumPy, torch warns on every import ("Failed to initialize NumPy"), and the
    # course's scripts would print that before their grids.
    if ! "$VENV/bin/python" -c 'import numpy' 2>/dev/null; then
        log "installing numpy into $VENV"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check numpy ||
            die "pip install numpy into $VENV failed (what pip said is above)"
    fi
}

install_torch() {
    command -v python3 >/dev/null 2>&1 || die "python3 not found: install Python 3.11 or later"
    log "installing torch==$TORCH_VERSION into $VENV (a few GB, once per machine)"
    mkdir -p "$(dirname "$VENV")"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        # Debian and Ubuntu ship venv's ensurepip in a package of its own.
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "python3 -m venv failed: installing python3-venv"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
        else
            die "python3 -m venv $VENV failed: install python3-venv (Debian, Ubuntu) and run this again"
        fi
    fi
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" ||
        die "pip install torch==$TORCH_VERSION into $VENV failed (what pip said is above)"
    [[ -x $VENV/bin/torchrun ]] || die "torch installed but $VENV/bin/torchrun is missing"
    log "torch $TORCH_VERSION installed: $VENV/bin/torchrun"
}

[[ $# -eq 1 ]] || usage
case $1 in
install) cmd_install ;;
dir) printf '%s\n' "$VENV" ;;
*) usage ;;
esac

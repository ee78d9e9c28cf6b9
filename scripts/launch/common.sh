#!/usr/bin/env bash
# Shared by the launch recipes (sourced, never run): checks DATA_DIR and builds --train-data, splits
# the global batch over the ranks, and either launches or, with --dry-run among the arguments, runs
# the trainer's own check in this shell.
#   DATA_DIR=/data/cc3m/train source scripts/launch/common.sh
set -euo pipefail

PYTHON="${PYTHON:-python}"

fail() {
    echo "error: $*" >&2
    exit 2
}

[ -n "${DATA_DIR:-}" ] || fail "set DATA_DIR to the img2dataset output folder holding 00000.tar, 00001.tar, ..."
[ -d "$DATA_DIR" ] || fail "DATA_DIR=$DATA_DIR is not a directory; point it at your img2dataset webdataset output"
SHARDS=$(find "$DATA_DIR" -maxdepth 1 -name '*.tar' -printf '%f\n' | grep -E '^[0-9]+\.tar$' | sort || true)
[ -n "$SHARDS" ] || fail "no NNNNN.tar shards in $DATA_DIR (img2dataset --output_format webdataset writes them)"
FIRST=$(head -n 1 <<< "$SHARDS")
LAST=$(tail -n 1 <<< "$SHARDS")
# img2dataset numbers shards with zero padding; braceexpand keeps the padding of the first bound.
# A missing shard inside the range is named by the trainer's check (run the recipe with --dry-run).
TRAIN_DATA="$DATA_DIR/{${FIRST%.tar}..${LAST%.tar}}.tar"
export TRAIN_DATA

# per_rank_batch GLOBAL_BATCH WORLD_SIZE: the per-rank --batch-size, refusing a split that would
# silently change the global batch (use as BATCH=$(per_rank_batch ...): the error ends the recipe).
per_rank_batch() {
    local global=$1 world=$2
    if (( world < 1 || global % world != 0 )); then
        fail "the global batch $global does not split evenly over $world ranks; set GLOBAL_BATCH to a multiple of $world"
    fi
    echo $(( global / world ))
}

# recipe_flags RECIPE WORLD_SIZE: RECIPE_FLAGS=(--recipe RECIPE ...) with the overrides the environment
# asks for (GLOBAL_BATCH, NUM_SAMPLES, WORKERS, DIST_TIMEOUT). The recipe itself (its flags, its global batch)
# lives in training/trainer/launch/recipes/; a global batch that does not split over the ranks is refused here, before
# anything is launched.
recipe_flags() {
    local name=$1 world=$2 batch
    RECIPE_FLAGS=(--recipe "$name")
    if [ -n "${GLOBAL_BATCH:-}" ]; then
        batch=$(per_rank_batch "$GLOBAL_BATCH" "$world")
        RECIPE_FLAGS+=(--batch-size "$batch")
    else
        "$PYTHON" -m training.trainer.launch.recipes "$name" --world-size "$world" --check || exit 2
    fi
    if [ -n "${NUM_SAMPLES:-}" ]; then RECIPE_FLAGS+=(--train-num-samples "$NUM_SAMPLES"); fi
    if [ -n "${WORKERS:-}" ]; then RECIPE_FLAGS+=(--workers "$WORKERS"); fi
    if [ -n "${DIST_TIMEOUT:-}" ]; then RECIPE_FLAGS+=(--dist-timeout "$DIST_TIMEOUT"); fi
}

# launch WORLD_SIZE TRAINER_ARGS...: exec "${LAUNCHER[@]}" TRAINER_ARGS (LAUNCHER ends with the
# trainer module, e.g. (torchrun ... -m training.main --)); with FORWARD_SIGNALS set (e.g. "USR1 TERM"),
# run it in the background instead and pass those signals on to it (run_forwarding_signals). With
# --dry-run among the arguments, print the launch command and run the trainer's dry run here, as rank 0
# of WORLD_SIZE, so that it works on a login node or on one node of a multi-node run (no GPU, no
# rendezvous with the other nodes).
launch() {
    local world=$1
    shift
    local arg
    for arg in "$@"; do
        if [ "$arg" = "--dry-run" ]; then
            echo "launch command: $(printf '%q ' "${LAUNCHER[@]}" "$@")"
            WORLD_SIZE="$world" RANK=0 LOCAL_RANK=0 exec "$PYTHON" -m training.main "$@"
        fi
    done
    if [ -n "${FORWARD_SIGNALS:-}" ]; then
        run_forwarding_signals "${LAUNCHER[@]}" "$@"
    else
        exec "${LAUNCHER[@]}" "$@"
    fi
}

# run_forwarding_signals COMMAND...: run COMMAND in the background, send it each signal of
# FORWARD_SIGNALS this shell receives, and return its exit status. A SLURM job script needs this:
# `#SBATCH --signal=B:USR1@120` signals the script's shell only, and bash runs a trap only between
# commands, so an `exec`ed or foreground srun would never hear of it.
run_forwarding_signals() {
    "$@" &
    local child=$! status=0 signal_name
    FORWARDED=0
    for signal_name in $FORWARD_SIGNALS; do
        # shellcheck disable=SC2064  # expand now: the trap runs after this function returned
        trap "FORWARDED=1; echo \"launch: forwarding SIG$signal_name to $1 (pid $child)\" >&2; kill -$signal_name $child 2>/dev/null || true" "$signal_name"
    done
    while true; do
        FORWARDED=0
        wait "$child" && status=0 || status=$?
        # wait returns early (status > 128) when a trap ran: wait again, for the child's own status (bash
        # keeps it for a child that has ended meanwhile, so a quick exit is not mistaken for the signal)
        [ "$FORWARDED" = 1 ] || break
    done
    return "$status"
}

# torchrun_launcher RUN_ID: LAUNCHER and WORLD for GPUS processes on each of NNODES nodes.
# One node: --standalone (a free local port, so two single-node runs never collide). Several nodes:
# c10d rendezvous at MASTER_ADDR:MASTER_PORT under RUN_ID, which assigns the node ranks; start the
# same command on every node.
torchrun_launcher() {
    local run_id=$1
    GPUS="${GPUS:-8}"
    NNODES="${NNODES:-1}"
    WORLD=$(( GPUS * NNODES ))
    local rendezvous=(--standalone)
    if (( NNODES > 1 )); then
        [ -n "${MASTER_ADDR:-}" ] || fail "NNODES=$NNODES: set MASTER_ADDR to the hostname of one of the nodes (the same on every node)"
        rendezvous=(--rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" --rdzv_id "${RUN_ID:-$run_id}")
    fi
    # "--" before the trainer's arguments: torchrun 2.x otherwise claims --logs (docs/cluster.md).
    LAUNCHER=(torchrun --nnodes "$NNODES" --nproc_per_node "$GPUS" "${rendezvous[@]}" -m training.main --)
}

#!/usr/bin/env bash
# CC12M, ViT-B/32: the recipe cc12m-vitb32 (training/trainer/launch/recipes/: global batch 2048, FastCLIP's CC12M setting,
# docs/peers.md §5, with --loss adacl), launched by torchrun on one node or several.
#   DATA_DIR=/data/cc12m/train NUM_SAMPLES=10000000 GPUS=8 NNODES=2 MASTER_ADDR=node0 \
#       bash scripts/launch/cc12m_vitb32_torchrun.sh [--dry-run] [flags]     (on every node)
# Extra flags are appended, so they override the recipe's (e.g. --device cpu --workers 2).
set -euo pipefail
source "$(dirname "$0")/common.sh"
torchrun_launcher cc12m-vitb32
recipe_flags cc12m-vitb32 "$WORLD"
launch "$WORLD" "${RECIPE_FLAGS[@]}" --train-data "$TRAIN_DATA" \
    ${VAL_DATA:+--val-data "$VAL_DATA"} ${VAL_NUM_SAMPLES:+--val-num-samples "$VAL_NUM_SAMPLES"} \
    ${IMAGENET_VAL:+--imagenet-val "$IMAGENET_VAL"} \
    --logs "${LOGS:-./logs}" --name "${NAME:-cc12m-vitb32-adacl}" "$@"

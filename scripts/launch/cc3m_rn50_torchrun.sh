#!/usr/bin/env bash
# CC3M, RN50: the recipe cc3m-rn50 (training/trainer/launch/recipes/: OpenCLIP's CC3M recipe, lr 1e-3, wd 0.1, warmup
# 10k, 30 epochs, global batch 1024, with --loss adacl), launched by torchrun on one node or several.
#   DATA_DIR=/data/cc3m/train NUM_SAMPLES=2800000 GPUS=8 bash scripts/launch/cc3m_rn50_torchrun.sh [--dry-run] [flags]
# Several nodes: the same command on every node with NNODES=N MASTER_ADDR=<one node's hostname>.
# Extra flags are appended, so they override the recipe's (e.g. --device cpu --workers 2).
set -euo pipefail
source "$(dirname "$0")/common.sh"
torchrun_launcher cc3m-rn50
recipe_flags cc3m-rn50 "$WORLD"
launch "$WORLD" "${RECIPE_FLAGS[@]}" --train-data "$TRAIN_DATA" \
    ${VAL_DATA:+--val-data "$VAL_DATA" --val-num-samples "${VAL_NUM_SAMPLES:-13000}"} \
    ${IMAGENET_VAL:+--imagenet-val "$IMAGENET_VAL"} \
    --logs "${LOGS:-./logs}" --name "${NAME:-cc3m-rn50-adacl}" "$@"

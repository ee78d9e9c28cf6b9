#!/usr/bin/env bash
# CC12M, ViT-B/32, global batch 2048 (FastCLIP's CC12M setting, docs/peers.md §5), --loss adacl, launched by
# torchrun on one node or several.
#   DATA_DIR=/data/cc12m/train NUM_SAMPLES=10000000 GPUS=8 NNODES=2 MASTER_ADDR=node0 \
#       bash scripts/launch/cc12m_vitb32_torchrun.sh [--dry-run] [flags]     (on every node)
# Extra flags are appended, so they override the recipe's (e.g. --device cpu --workers 2).
set -euo pipefail
source "$(dirname "$0")/common.sh"
torchrun_launcher cc12m-vitb32
BATCH=$(per_rank_batch "${GLOBAL_BATCH:-2048}" "$WORLD")
launch "$WORLD" \
    --train-data "$TRAIN_DATA" --train-num-samples "${NUM_SAMPLES:-10000000}" --dataset-type webdataset \
    ${VAL_DATA:+--val-data "$VAL_DATA"} ${VAL_NUM_SAMPLES:+--val-num-samples "$VAL_NUM_SAMPLES"} \
    ${IMAGENET_VAL:+--imagenet-val "$IMAGENET_VAL"} \
    --model ViT-B-32 --loss adacl --batch-size "$BATCH" --lr 1e-3 --wd 0.1 --warmup 10000 --epochs 32 \
    --precision amp --workers "${WORKERS:-8}" --local-loss --gather-with-grad --grad-checkpointing --dist-timeout "${DIST_TIMEOUT:-1800}" \
    --save-frequency 1 --save-every-n-steps 2000 --keep-step-checkpoints 2 --zeroshot-frequency 2 --report-to tensorboard \
    --logs "${LOGS:-./logs}" --name "${NAME:-cc12m-vitb32-adacl}" --resume latest --device cuda "$@"

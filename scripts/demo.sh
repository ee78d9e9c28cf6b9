#!/usr/bin/env bash
# README command (1): install into ./.venv if needed, generate the built-in demo data, train the
# tiny model with AdaCL on the CPU for a few minutes, export it to plain OpenCLIP format and
# evaluate the export with the stock clip-benchmark (zero-shot classification, retrieval) and our
# clone-negative selection. Everything goes under ./demo (DEMO_DIR to change).
#   bash scripts/demo.sh [extra training flags, e.g. --loss clip --epochs 4]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
DEMO="${DEMO_DIR:-demo}"
DATA="$DEMO/data"
RUN_NAME="${RUN_NAME:-adacl-tiny-$(date +%Y%m%d-%H%M%S)}"

if [ ! -f "$DATA/manifest.json" ]; then
    python scripts/make_synthetic_shards.py --output "$DATA" --num-train 8192 --num-val 512 --num-test 512
fi
split() { python -c "import json,sys; print('$DATA/' + json.load(open('$DATA/manifest.json'))['splits']['$1']['data'])"; }

echo "== training adacl-tiny with --loss adacl (log: $DEMO/logs/$RUN_NAME/out.log)"
python -m training.main \
    --train-data "$(split train)" --val-data "$(split val)" --dataset-type webdataset \
    --model adacl-tiny --loss adacl --batch-size 128 --epochs 8 --lr 2e-3 --wd 0.1 --warmup 50 \
    --workers 1 --device cpu --precision fp32 --seed 0 --log-every-n-steps 16 \
    --logs "$DEMO/logs" --name "$RUN_NAME" "$@"

CHECKPOINT=$(ls -t "$DEMO/logs/$RUN_NAME/checkpoints"/epoch_*.pt | head -1)
echo "== evaluating $CHECKPOINT (exported to plain OpenCLIP format, stock clip-benchmark CLI)"
python -m training.evaluate --checkpoint "$CHECKPOINT" --demo-root "$DATA" --output-dir "$DEMO/eval/$RUN_NAME"
python scripts/plot_margins.py "$DEMO/logs/$RUN_NAME"

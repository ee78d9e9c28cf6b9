#!/usr/bin/env bash
# README command (1): install into ./.venv if needed, generate the built-in demo data, train the
# tiny model with AdaCL on the CPU for a few minutes, export it to plain OpenCLIP format and
# evaluate the export with the stock clip-benchmark (zero-shot classification, retrieval) and our
# clone-negative selection. Everything goes under ./demo (DEMO_DIR to change).
# The training data comes in families of one-edit siblings kept together in each batch; it trains on
# the gold captions (pass --caption-key txt_pseudo --val-caption-key txt for the pseudo captions).
#   bash scripts/demo.sh [extra training flags, e.g. --loss clip --epochs 4]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
DEMO="${DEMO_DIR:-demo}"
DATA="$DEMO/data"
RUN_NAME="${RUN_NAME:-adacl-tiny-$(date +%Y%m%d-%H%M%S)}"

# Families of 8 one-edit siblings, kept whole in each batch by --train-group-size 8 (docs/data.md).
FAMILY_SIZE=8
if [ -f "$DATA/manifest.json" ] && ! python -c "import json, sys; m = json.load(open('$DATA/manifest.json')); \
        sys.exit(m['scene_config']['family_size'] != $FAMILY_SIZE or 'caption_keys' not in m)"; then
    echo "== $DATA holds demo data from an older generator: writing it again"
    rm -rf "$DATA"
fi
if [ ! -f "$DATA/manifest.json" ]; then
    python -m training.synthetic_scenes --output "$DATA" --num-train 8192 --num-val 512 --num-test 512 \
        --family-size "$FAMILY_SIZE"
fi
split() { python -c "import json,sys; print('$DATA/' + json.load(open('$DATA/manifest.json'))['splits']['$1']['data'])"; }

echo "== training adacl-tiny with --loss adacl (log: $DEMO/logs/$RUN_NAME/out.log)"
# The recipe `demo` (training/trainer/launch/recipes/): adacl-tiny, --loss adacl, batch 128, 8 epochs, CPU, whole families
# of FAMILY_SIZE siblings per batch (--train-group-size "$FAMILY_SIZE").
python -m training.main --recipe demo --train-group-size "$FAMILY_SIZE" \
    --train-data "$(split train)" --val-data "$(split val)" --logs "$DEMO/logs" --name "$RUN_NAME" "$@"

CHECKPOINT=$(python -m training.trainer.run_folder.layout "$DEMO/logs/$RUN_NAME" --final-checkpoint)
echo "== evaluating $CHECKPOINT (exported to plain OpenCLIP format, stock clip-benchmark CLI)"
python -m training.evaluation --checkpoint "$CHECKPOINT" --demo-root "$DATA" --output-dir "$DEMO/eval/$RUN_NAME"
if [ -f "$DEMO/logs/$RUN_NAME/margins.png" ]; then  # AdaCL runs: the trainer redraws it at each epoch end
    echo "== AdaCL's margins over training: $DEMO/logs/$RUN_NAME/margins.png"
fi

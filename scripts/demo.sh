#!/usr/bin/env bash
# README command (1): install into ./.venv if needed, generate the built-in demo data, train the tiny model on
# the CPU twice, with the clone-aware loss the findings support (--loss adaclw --adaclw-discovery
# text_image_tokens, docs/findings.md) and with --loss clip, on the same seed and data order; export each to plain
# OpenCLIP format, evaluate the exports with the stock clip-benchmark (zero-shot classification, retrieval) and our
# clone-negative selection, and print the two side by side. Everything goes under ./demo (DEMO_DIR to change).
# The training data comes in families of one-edit siblings kept together in each batch; it trains on
# the gold captions (pass --caption-key txt_pseudo --val-caption-key txt for the pseudo captions).
#   bash scripts/demo.sh [extra training flags for both runs, e.g. --epochs 8]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
DEMO="${DEMO_DIR:-demo}"
DATA="$DEMO/data"
RUN_NAME="${RUN_NAME:-adacl-tiny-$(date +%Y%m%d-%H%M%S)}"  # each run adds its loss: <RUN_NAME>-adaclw, -clip

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

# The recipe `demo` (training/trainer/launch/recipes/): adacl-tiny, --loss adaclw --adaclw-discovery text_image_tokens,
# batch 128, 4 epochs, seed 0, CPU, whole families of FAMILY_SIZE siblings per batch (--train-group-size).
train_and_evaluate() {  # LOSS [loss flags]: train the recipe with that loss, evaluate its last checkpoint
    local loss="$1" run="$RUN_NAME-$1"
    shift
    echo "== training adacl-tiny with --loss $loss (log: $DEMO/logs/$run/out.log)"
    python -m training.main --recipe demo --loss "$loss" --train-group-size "$FAMILY_SIZE" \
        --train-data "$(split train)" --val-data "$(split val)" --logs "$DEMO/logs" --name "$run" "$@"
    local checkpoint
    checkpoint=$(python -m training.trainer.run_folder.layout "$DEMO/logs/$run" --final-checkpoint)
    echo "== evaluating $checkpoint (exported to plain OpenCLIP format, stock clip-benchmark CLI)"
    python -m training.evaluation --checkpoint "$checkpoint" --demo-root "$DATA" --output-dir "$DEMO/eval/$run"
}
train_and_evaluate adaclw "$@"
train_and_evaluate clip "$@"

echo "== clip and adaclw (text_image_tokens), one seed each, same initialisation and data order; the paired-seed"
echo "   evidence for what helps is docs/findings.md"
python -m training.evaluation.side_by_side clip="$DEMO/eval/$RUN_NAME-clip" adaclw="$DEMO/eval/$RUN_NAME-adaclw"

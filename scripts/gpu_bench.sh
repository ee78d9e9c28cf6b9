#!/usr/bin/env bash
# GPU throughput and peak memory of AdaCL against CLIP, one command, at most 17 minutes (four parts of at most 4 or 5):
#   bash scripts/gpu_bench.sh [OUTPUT_DIR]            on a CUDA machine; OUTPUT_DIR defaults to docs/gpu_bench
#   bash scripts/gpu_bench.sh --smoke OUTPUT_DIR      the same steps on the CPU at toy sizes (a check, seconds)
# Needs the project installed (e.g. `source scripts/setup_env.sh`).
#   1. training step (forward, loss, backward, AdamW; amp) of ViT-B-32 at the CC12M recipe's per-GPU
#      batch 256, --loss clip and --loss adacl: time and their ratio (scripts/bench_step.py);
#   2. the loss alone, forward + backward at N = 32768, D = 512, on bench_loss.py's three inputs (random
#      features at logit scale 14.3, trained-like ones at 50 and 100): ClipLoss and AdaCL's two modes on
#      each selection path, auto (the default), fused (Triton kernels) and eager (scripts/bench_loss.py);
#   3. the loss's peak memory at N = 32768, D = 512 (torch.cuda.max_memory_allocated, each case in a fresh
#      process; trained-like inputs at 50, the default path and the eager passes) and its ratio to ClipLoss's;
#   4. every registered loss (adacl in both modes, adaclw with each discovery) at N = 32768, D = 512 on the
#      trained-like inputs at 50: time, peak memory, aten ops, host waits, each beside ClipLoss's
#      (scripts/bench_costs.py --device cuda).
# Writes OUTPUT_DIR/step.json, step.md, loss.json, loss.md, memory.md, costs.md and summary.md (device, commit,
# commands, the one table of the first two parts, then each part's own report); paste summary.md where
# docs/THROUGHPUT.md says.
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
if [ "${1:-}" = "--smoke" ]; then
    SMOKE=1
    shift
fi
if [ "$#" -gt 1 ] || [[ "${1:-}" == -* ]]; then
    echo "error: unexpected arguments '$*'; usage: bash scripts/gpu_bench.sh [--smoke] [OUTPUT_DIR]" >&2
    exit 2
fi
OUT_DIR="${1:-docs/gpu_bench}"
PYTHON="${PYTHON:-python}"
if ! "$PYTHON" -c "import training.trainer.engine.loop, open_clip_adacl" 2>/dev/null; then
    echo "error: $PYTHON cannot import the project; install it first (source scripts/setup_env.sh)" >&2
    exit 2
fi
if (( SMOKE )); then
    STEP=("$PYTHON" scripts/bench_step.py --smoke --device cpu)
    LOSS=("$PYTHON" scripts/bench_loss.py --sizes 128 --dim 32 --repeats 1 --device cpu)
    MEMORY=("$PYTHON" scripts/bench_loss.py --sizes 128 --dim 32 --device cpu --inputs trained-50 --paths auto --memory-only)
    COSTS=("$PYTHON" scripts/bench_costs.py --sizes 64 --dim 16 --repeats 1 --device cpu)
else
    if ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        echo "error: no CUDA device; run with --smoke for a CPU check" >&2
        exit 2
    fi
    STEP=("$PYTHON" scripts/bench_step.py --cases ViT-B-32:256 --device cuda --precision amp --warmup-steps 5 --repeats 20)
    LOSS=("$PYTHON" scripts/bench_loss.py --sizes 32768 --dim 512 --device cuda --repeats 5)
    MEMORY=("$PYTHON" scripts/bench_loss.py --sizes 32768 --dim 512 --device cuda --inputs trained-50 --paths auto eager --memory-only)
    COSTS=("$PYTHON" scripts/bench_costs.py --sizes 32768 --dim 512 --repeats 3 --device cuda)
fi
mkdir -p "$OUT_DIR"
timeout 240 "${STEP[@]}" --output "$OUT_DIR/step.json" > "$OUT_DIR/step.md"
timeout 240 "${LOSS[@]}" --output "$OUT_DIR/loss.md" --json "$OUT_DIR/loss.json" > /dev/null
timeout 240 "${MEMORY[@]}" --output "$OUT_DIR/memory.md" > /dev/null
timeout 300 "${COSTS[@]}" --output "$OUT_DIR/costs.md" > /dev/null
{
    echo "# GPU benchmarks, $(date -u +%Y-%m-%d)"
    echo
    echo "Commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $("$PYTHON" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU')")."
    echo
    echo "\`${STEP[*]}\`"
    echo
    echo "\`${LOSS[*]}\`"
    echo
    echo "\`${MEMORY[*]}\`"
    echo
    echo "\`${COSTS[*]}\`"
    echo
    "$PYTHON" scripts/bench_loss.py --combine "$OUT_DIR/step.json" "$OUT_DIR/loss.json"
    echo
    echo "## Training step, --loss clip vs --loss adacl"
    echo
    cat "$OUT_DIR/step.md"
    echo
    echo "## Loss only"
    echo
    cat "$OUT_DIR/loss.md"
    echo
    echo "## Loss only, peak memory"
    echo
    cat "$OUT_DIR/memory.md"
    echo
    echo "## Every registered loss, time, peak memory and host waits"
    echo
    cat "$OUT_DIR/costs.md"
} > "$OUT_DIR/summary.md"
cat "$OUT_DIR/summary.md"

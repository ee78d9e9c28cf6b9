#!/usr/bin/env bash
# The glyph benchmark's data in one command on a fresh machine: creates ./.venv if needed (as the README's
# commands do), then writes the data into DIR (default data/glyphs; it must be new or empty).
#   bash scripts/glyph_data.sh [DIR] [python -m studies.glyphs options, e.g. --data-seed 1]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
OUTPUT="${1:-data/glyphs}"
shift || true
python -m studies.glyphs --output "$OUTPUT" "$@"

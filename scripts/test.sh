#!/usr/bin/env bash
# README command (2): install into ./.venv if needed, then run the test suite on the CPU.
#   bash scripts/test.sh            default suite (no tests marked slow)
#   bash scripts/test.sh --slow     everything, slow tests included
#   extra arguments go to pytest, e.g. bash scripts/test.sh -k adacl
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
MARKERS=(-m "not slow")
if [ "${1:-}" = "--slow" ]; then MARKERS=(); shift; fi
python -m pytest "${MARKERS[@]}" "$@"

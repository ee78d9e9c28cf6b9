#!/usr/bin/env bash
# README command (2): install into ./.venv if needed, then run the test suite on the CPU.
#   bash scripts/test.sh            default suite (no tests marked slow or browser)
#   bash scripts/test.sh --slow     everything, slow and browser tests included
#   bash scripts/test.sh --slow-only  only the tests marked slow (trainers, launchers and pip in subprocesses, several ranks, compiles; CI runs them)
#   bash scripts/test.sh --browser  the tests that drive headless Chromium (apt-get install -y chromium first)
#   extra arguments go to pytest, e.g. bash scripts/test.sh -k adacl  (-n 0: one process, for -s or --pdb)
# Two pytest-xdist workers, each test file on one worker so a module's shared runs are made once. Most tests use
# one core (OMP_NUM_THREADS=1), so two workers keep both of a 2-core machine's cores busy.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
MARKERS=(-m "not slow and not browser")
case "${1:-}" in
    --slow) MARKERS=(); shift ;;
    --slow-only) MARKERS=(-m "slow and not browser"); shift ;;
    --browser) MARKERS=(-m browser); shift ;;
esac
python -m pytest -n 2 --dist loadfile "${MARKERS[@]}" "$@"

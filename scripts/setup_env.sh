#!/usr/bin/env bash
# Sourced by the README's commands: creates ./.venv on first use and installs the project
# (editable, with the training, eval, test and wandb extras: everything the demo, the tests, the benchmarks
# and the laboratory in studies/ import) into it at the tested versions of
# constraints.txt; later calls reinstall only when setup.py or constraints.txt changed.
# Needs only python3 (>= 3.10) with venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ADACL_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating virtual environment in $VENV"
    "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.open_clip_adacl-installed"
WANT="$(cat "$ROOT/setup.py" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "[setup] installing open_clip_adacl and its dependencies (a few minutes the first time)"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -c "$ROOT/constraints.txt" -e "$ROOT[training,eval,test,wandb]"
    "$VENV/bin/python" -m pip check
    echo "$WANT" > "$STAMP"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

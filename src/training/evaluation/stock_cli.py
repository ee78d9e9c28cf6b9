"""`python -m training.evaluation.stock_cli FOLDER eval ...`: the stock clip-benchmark CLI, `python -m
clip_benchmark.cli eval ...`, run as it is (its own module as `__main__`), except that a result it cannot write (a
full disk, a read-only folder, a revoked permission) ends in one `error:` line naming FOLDER, where its results go,
and the cause, with STOCK_WRITE_FAILED, instead of its traceback. `zero_shot.run_stock_cli` runs it."""

from __future__ import annotations

import runpy
import sys
from typing import Sequence

from training.trainer.run_folder.safe_write import WriteFailed, tool_writes

STOCK_WRITE_FAILED = 3  # a failed write, said in one line (the stock CLI itself exits 0, or 1 with a traceback)
WRITE_FIX = "free space or choose another --output-dir"  # what to do about a failed write of the evaluation


def main(argv: Sequence[str]) -> None:
    folder, *stock_argv = argv
    sys.argv = ["clip_benchmark", *stock_argv]
    with tool_writes(folder, WRITE_FIX):
        try:
            runpy.run_module("clip_benchmark.cli", run_name="__main__", alter_sys=True)
        except OSError as error:
            error.filename = None  # a file of the staged folder the caller removes: FOLDER is named instead
            raise


def cli() -> None:
    try:
        main(sys.argv[1:])
    except WriteFailed as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(STOCK_WRITE_FAILED)


if __name__ == "__main__":
    cli()

"""Each row of the fault table's new-user rows (`helpers.fault_rows`, docs/cluster.md) holds: its command, run through
the tool's console entry point with the row's environment, exits with the row's status and prints the row's line, and
no traceback. A row whose process needs limits of its own (a file-size limit) runs as a process (marked slow, as
`tests/fault_table.py --cases new_user_faults` runs every row); the rest run here, in this process."""

import importlib
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

from helpers.fault_rows import ROWS, FaultRow, grey16_png, launcher_free, write_fault_inputs
from training.main import main
from training.trainer.data.samples import decode_image
from training.trainer.run_folder.logger import end_logging

# The module holding each tool's console entry point, `cli()`.
CLI_MODULES = {
    "training.main": "training.main",
    "training.export": "training.export",
    "training.discover": "training.discover.cli",
}


@pytest.fixture(scope="module")
def inputs(demo_shards, module_tmp):
    return write_fault_inputs(module_tmp("fault-rows"), demo_shards, main)


def in_process(row: FaultRow, inputs, monkeypatch, capsys) -> tuple:
    """(exit status, stdout and stderr) of `python -m TOOL ARGV` run as the row says, through the tool's `cli()`."""
    for name in set(os.environ) - set(launcher_free(os.environ)):
        monkeypatch.delenv(name)
    for name, value in row.env.items():
        monkeypatch.setenv(name, value)
    if row.env.get("HF_HUB_OFFLINE"):  # the hub client reads it once, at import
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr(sys, "argv", [row.tool, *row.argv(inputs)])
    cli = importlib.import_module(CLI_MODULES[row.tool]).cli
    try:
        cli()
        status = 0
    except SystemExit as stop:
        status = stop.code or 0
    finally:
        end_logging()
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def as_process(row: FaultRow, inputs) -> tuple:
    """(exit status, stdout and stderr) of `python -m TOOL ARGV` in a process of its own, under the row's limit."""

    def limits():
        if row.file_size_limit:
            resource.setrlimit(resource.RLIMIT_FSIZE, (row.file_size_limit, row.file_size_limit))

    result = subprocess.run(
        [sys.executable, "-m", row.tool, *row.argv(inputs)],
        env={**launcher_free(os.environ), "OMP_NUM_THREADS": "1", **row.env},
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limits,
    )
    return result.returncode, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("row", [row for row in ROWS if not row.file_size_limit], ids=lambda row: row.name)
def test_a_fault_row_holds_for_its_command(row, inputs, monkeypatch, capsys):
    status, output = in_process(row, inputs, monkeypatch, capsys)
    assert row.problems(inputs, status, output) == [], output[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("row", [row for row in ROWS if row.file_size_limit], ids=lambda row: row.name)
def test_a_fault_row_that_needs_a_process_of_its_own_holds(row, inputs):
    status, output = as_process(row, inputs)
    assert row.problems(inputs, status, output) == [], output[-3000:]


def test_a_16_bit_grey_png_keeps_its_greys_instead_of_turning_white():
    """PIL's own conversion clips 16-bit values at 255: the 0..65535 ramp came out 99.6% white (mean 254.4)."""
    image, reason = decode_image(grey16_png(), max_pixels=10**6)
    pixels = np.asarray(image)
    assert reason is None and image.mode == "RGB"
    assert pixels.min() == 0 and pixels.max() == 255 and 126 < pixels.mean() < 129

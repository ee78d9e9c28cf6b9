"""The demo's last table: two evaluations' results.csv read back and set side by side with their difference."""

import csv
import subprocess
import sys

import pytest

from training.evaluation.side_by_side import main


def write_results(folder, rows):
    folder.mkdir(parents=True)
    with (folder / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["dataset", "task", "metric", "value"])
        writer.writeheader()
        writer.writerows({"dataset": d, "task": t, "metric": m, "value": v} for d, t, m, v in rows)


def test_two_runs_show_each_value_and_the_second_minus_the_first(tmp_path):
    write_results(
        tmp_path / "clip",
        [
            ("wds/a", "zeroshot_classification", "acc1", 0.5),
            ("clone_selection", "clone_selection", "overall_acc", 0.75),
        ],
    )
    write_results(
        tmp_path / "adaclw",
        [
            ("wds/a", "zeroshot_classification", "acc1", 0.625),
            ("clone_selection", "clone_selection", "overall_acc", 0.5),
            ("wds/b", "zeroshot_retrieval", "image_retrieval_recall@1", 0.25),  # only one run has it: left out
        ],
    )
    table = main([f"clip={tmp_path / 'clip'}", f"adaclw={tmp_path / 'adaclw'}"])
    assert table.splitlines() == [
        "| dataset | task | metric | clip | adaclw | adaclw - clip |",
        "|---|---|---|---|---|---|",
        "| wds/a | zeroshot_classification | acc1 | 0.5000 | 0.6250 | 0.1250 |",
        "| clone_selection | clone_selection | overall_acc | 0.7500 | 0.5000 | -0.2500 |",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "run, message",
    [
        ("clip", "'clip': give each run as LABEL=DIR"),
        ("clip=nowhere", "nowhere/results.csv does not exist: give a folder that python -m training.evaluation wrote"),
    ],
)
def test_a_bad_run_is_one_line(run, message, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "training.evaluation.side_by_side", run],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    [line] = result.stderr.splitlines()
    assert result.returncode == 2 and line.startswith(f"error: {message}")

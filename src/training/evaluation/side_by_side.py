"""`python -m training.evaluation.side_by_side LABEL=DIR LABEL=DIR ...`: the tables that `python -m
training.evaluation --output-dir DIR` wrote for several runs, as one table with a column per run and, with two runs,
their difference (the second minus the first). The demo prints its two runs this way; it reads only the
`results.csv` files, so it runs without the [eval] extra."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from training.export import markdown_table
from training.trainer.launch.tool_flags import OneLineErrorParser

RESULTS_FILE = "results.csv"
Key = Tuple[str, str, str]  # (dataset, task, metric)


def read_results(output_dir: Path) -> Dict[Key, float]:
    """One evaluation's values by (dataset, task, metric), in the order its table lists them."""
    path = output_dir / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give a folder that python -m training.evaluation wrote")
    with path.open(newline="") as f:
        return {(row["dataset"], row["task"], row["metric"]): float(row["value"]) for row in csv.DictReader(f)}


def side_by_side(runs: Sequence[Tuple[str, Dict[Key, float]]]) -> str:
    """The runs' values as one Markdown table: the rows every run has, in the first run's order; with two runs a
    last column holds the second's value minus the first's."""
    labels = [label for label, _ in runs]
    keys = [key for key in runs[0][1] if all(key in values for _, values in runs)]
    header = ["dataset", "task", "metric", *labels]
    if len(runs) == 2:
        header.append(f"{labels[1]} - {labels[0]}")
    rows: List[List[object]] = []
    for key in keys:
        values = [run_values[key] for _, run_values in runs]
        rows.append([*key, *values, *([values[1] - values[0]] if len(runs) == 2 else [])])
    return markdown_table(header, rows)


def parse_run(text: str) -> Tuple[str, Path]:
    label, separator, folder = text.partition("=")
    if not separator or not label or not folder:
        raise ValueError(f"{text!r}: give each run as LABEL=DIR (e.g. clip=demo/eval/run-clip)")
    return label, Path(folder)


def main(argv: Sequence[str] | None = None) -> str:
    parser = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", nargs="+", help="LABEL=DIR: a label and the --output-dir of python -m training.evaluation"
    )
    args = parser.parse_args(argv)
    try:
        runs = [(label, read_results(folder)) for label, folder in map(parse_run, args.runs)]
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    table = side_by_side(runs)
    print(table, end="")
    return table


if __name__ == "__main__":
    main(sys.argv[1:])

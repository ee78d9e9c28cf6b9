"""How often the false-negative peers acted in the clone study's scratch runs, from every logged step.

    python -m studies peers --runs runs/clone_study/scratch/runs > docs/results/scratch_peers.md

GloFND: the fraction of negatives masked as false negatives (`stats/<direction>/masked_frac`); FNE: the
fraction down-weighted (`downweighted_frac`) and the mean negative weight (`weight_mean`, 1 = CLIP). Both
directions pooled; mean over the run's logged steps and the largest single step.
"""

import argparse
import json
import statistics
from pathlib import Path

from .command import Command, register_command

STATS = {"glofnd": ("masked_frac",), "fne": ("downweighted_frac", "weight_mean")}


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=Path, default=Path("runs/clone_study/scratch/runs"))


def run(args: argparse.Namespace) -> None:
    print("| run | logged steps | statistic | mean over steps | largest step |\n|---|---|---|---|---|")
    for loss, names in STATS.items():
        for metrics in sorted(args.runs.glob(f"{loss}-seed*/metrics.jsonl")):
            steps = [line for line in map(json.loads, metrics.read_text().splitlines()) if line["kind"] == "train"]
            for name in names:
                values = [
                    step[f"stats/{d}/{name}"] for step in steps for d in ("i2t", "t2i") if f"stats/{d}/{name}" in step
                ]
                print(
                    f"| `{metrics.parent.name}` | {len(steps)} | `{name}` | {statistics.fmean(values):.5f} | "
                    f"{max(values):.4f} |"
                )


register_command(Command("peers", __doc__, run, options))

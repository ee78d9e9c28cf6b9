"""Trajectories of AdaCL's margins over training, from a run's metrics file.

    python scripts/plot_margins.py RUN_DIR [--output PATH]

Reads RUN_DIR/metrics.jsonl (one JSON object per logged step with "step" and the loss's stats,
whose keys end in "<direction>/<name>", e.g. "stats/i2t/m1") and draws m1 / logit_scale, m2, the
anchor similarity, p_u and the number of clone candidates for both directions, plus the share of
steps that fell back to vanilla CL, into RUN_DIR/margins.png: the counterpart of the paper's
tuning-process figure, and the first place to look for a drifting anchor or exploding margins.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DIRECTIONS = ("i2t", "t2i")
PANELS = (
    ("m1_over_scale", "m1 / logit_scale"),
    ("m2", "m2"),
    ("anchor", "anchor similarity a = s_uu"),
    ("p_u", "anchor probability p_u"),
    ("candidates", "clone candidates |S~|"),
    ("modulated", "modulated (1) / vanilla fallback (0)"),
)

Series = Dict[str, Tuple[List[float], List[float]]]


def read_series(metrics_path: Path) -> Series:
    """{"<direction>/<name>": (steps, values)} for every panel's stat found in the file."""
    wanted = {f"{direction}/{name}" for direction in DIRECTIONS for name, _ in PANELS}
    series: Series = {}
    with open(metrics_path) as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            if "step" not in record:
                continue
            for key, value in record.items():
                suffix = "/".join(key.split("/")[-2:])
                if suffix in wanted and isinstance(value, (int, float)):
                    steps, values = series.setdefault(suffix, ([], []))
                    steps.append(record["step"])
                    values.append(float(value))
    return series


def plot_margins(run_dir: str, output: Optional[str] = None) -> Path:
    """Draws the panels into `output` (default RUN_DIR/margins.png) and returns its path."""
    run_dir = Path(run_dir)
    series = read_series(run_dir / "metrics.jsonl")
    if not series:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no AdaCL stats (keys ending in e.g. 'i2t/m1_over_scale')")
    figure, axes = plt.subplots(len(PANELS), 1, figsize=(8, 2.2 * len(PANELS)), sharex=True)
    for axis, (name, title) in zip(axes, PANELS):
        for direction in DIRECTIONS:
            steps, values = series.get(f"{direction}/{name}", ([], []))
            if steps:
                axis.plot(steps, values, label=direction, linewidth=1)
        axis.set_title(title, fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="best")
    axes[-1].set_xlabel("step")
    figure.tight_layout()
    path = Path(output) if output else run_dir / "margins.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a training run's directory, holding metrics.jsonl")
    parser.add_argument("--output", help="PNG path (default RUN_DIR/margins.png)")
    args = parser.parse_args(argv)
    print(plot_margins(args.run_dir, args.output))


if __name__ == "__main__":
    main()

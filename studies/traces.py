"""Per-step traces of a loss comparison's runs, compressed, and the collapse mechanism read from them.

    python -m studies traces --runs-dir runs/clone_study/controls/runs runs/clone_study/bank/runs \
        --traces docs/results/controls_traces.csv.gz --mechanism docs/results/controls_mechanism.md

Traces: one row per logged training step of every run: the trained loss, CLIP's loss on the same logits
(AdaCL runs), the global batch's mean image-text cosine, and AdaCL's anchor, m1/t, p_u and modulation, each
averaged over the two directions. Mechanism (docs/adacl.md §5): with detached margins a common shift of
every cosine changes the loss by mean_i (1 - p_i)(t - m1), so m1 < t at the first step predicts the batch's
cosines running down together, m1 > t up; the table puts the first step's m1/t beside where the mean cosine
went in the first 1% of steps and at the end, and whether the run collapsed.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional

from training import RunDir

from .command import Command, register_command
from .comparison import assess_run, outcome_file

DIRECTIONS = ("i2t", "t2i")
PER_DIRECTION = ("clip_loss", "anchor", "m1_over_scale", "p_u", "modulated")
COLUMNS = ("run", "step", "loss", "clip_loss", "mean_cosine", "anchor", "m1_over_scale", "p_u", "modulated")
EARLY_FRACTION = 0.01  # the first 1% of steps: where the detached reading's common mode moves


def trace_row(run: str, line: Dict[str, float]) -> Dict[str, object]:
    row: Dict[str, object] = {
        "run": run,
        "step": line["step"],
        "loss": line["loss"],
        "mean_cosine": line.get("stats/mean_cosine"),
    }
    for name in PER_DIRECTION:
        values = [line[key] for key in (f"stats/{d}/{name}" for d in DIRECTIONS) if key in line]
        row[name] = statistics.fmean(values) if values else None
    return row


def trace_name(run_dir: Path, runs_dirs: List[Path]) -> str:
    """The run's name, prefixed with its comparison's folder when several comparisons are traced: two
    comparisons name their runs alike (`clip-seed0`), and each trace must name one run."""
    return run_dir.name if len(runs_dirs) == 1 else f"{run_dir.parent.parent.name}/{run_dir.name}"


def rounded(value: object) -> object:
    return f"{value:.5g}" if isinstance(value, float) else ("" if value is None else value)


def write_traces(rows: List[Dict[str, object]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows([[rounded(row[column]) for column in COLUMNS] for row in rows])


def read_traces(path: Path) -> Dict[str, List[Dict[str, object]]]:
    """The committed traces (`write_traces`) back as rows per run, in the order written: what `mechanism_line`
    reads, to 5 significant digits."""

    def value(column: str, text: str) -> object:
        if column == "run" or text == "":
            return text or None
        return int(text) if column == "step" else float(text)

    runs: Dict[str, List[Dict[str, object]]] = {}
    with gzip.open(path, "rt", newline="") as handle:
        for row in csv.DictReader(handle):
            runs.setdefault(row["run"], []).append({column: value(column, row[column]) for column in COLUMNS})
    return runs


def mechanism_line(run: str, rows: List[Dict[str, object]], verdict: Optional[str]) -> Optional[str]:
    """One table row for a run that logged AdaCL's margins; None otherwise."""
    if rows[0]["m1_over_scale"] is None:
        return None
    early = rows[max(1, int(len(rows) * EARLY_FRACTION)) - 1]
    start, end = rows[0]["mean_cosine"], rows[-1]["mean_cosine"]
    ratio = rows[0]["m1_over_scale"]
    predicted = "down" if ratio < 1 else "up"
    observed = "down" if early["mean_cosine"] < start else "up"
    below = statistics.fmean(row["m1_over_scale"] < 1 for row in rows if row["modulated"])
    return (
        f"| `{run}` | {ratio:.3f} | {predicted} | {start:+.3f} | {early['mean_cosine']:+.3f} (step "
        f"{early['step']}) | {observed} | {end:+.3f} | {below:.1%} | {statistics.fmean(r['modulated'] for r in rows):.1%} "
        f"| {rows[-1]['loss']:.3f} / {rows[-1]['clip_loss']:.3f} | {verdict or '?'} |"
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs-dir",
        type=Path,
        nargs="+",
        required=True,
        help="comparisons' runs/ folders (each one's verdicts in the outcomes/ folder beside it)",
    )
    parser.add_argument("--traces", type=Path, required=True, help="the .csv.gz to write")
    parser.add_argument("--mechanism", type=Path, required=True, help="the Markdown table to write")


def run(args: argparse.Namespace) -> None:

    all_rows, lines = [], []
    for run_dir in sorted((path for runs_dir in args.runs_dir for path in runs_dir.iterdir()), key=lambda p: p.name):
        rows = [trace_row(trace_name(run_dir, args.runs_dir), line) for line in RunDir(run_dir).metrics("train")]
        if not rows:
            continue
        all_rows += rows
        outcome_path = outcome_file(run_dir.parent.parent, run_dir.name)
        verdict = assess_run(json.loads(outcome_path.read_text()))["verdict"] if outcome_path.is_file() else None
        line = mechanism_line(trace_name(run_dir, args.runs_dir), rows, verdict)
        if line:
            lines.append(line)
    write_traces(all_rows, args.traces)
    args.mechanism.write_text(
        "\n".join(
            [
                "# The detached reading's common mode, run by run",
                "",
                f"Generated by `python -m studies traces` from the metrics.jsonl of the runs in "
                f"{', '.join(f'`{runs_dir}`' for runs_dir in args.runs_dir)} (every step: "
                f"[{args.traces.name}]({args.traces.name})). m1/t at step 1 < 1 predicts the batch's image-text cosines "
                "falling together under detached margins (the loss changes by mean_i (1 - p_i)(t - m1) per unit of common "
                "shift), > 1 rising; *early* is the mean cosine after the first 1% of steps. Both directions averaged. "
                "The closed-form readings are listed too: their common-mode force is not (t - m1).",
                "",
                "| run | m1/t at step 1 | predicted | mean cosine, step 1 | early | observed | final | modulated steps "
                "with m1 < t | steps modulated | final loss / CLIP's loss on the same logits | verdict |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
                *lines,
                "",
            ]
        )
    )
    print(f"wrote {args.traces} ({len(all_rows)} steps) and {args.mechanism}")


register_command(Command("traces", __doc__, run, options))

"""The headroom calibration of the glyph benchmark (docs/preregistration_headroom.md): the positive controls
only, on fresh paired seeds, in the cells the pre-registration names, each moving a lever of the frozen
`finetune-gold` cell (which stays as it is), judged on family accuracy without the diacritic-mark siblings.

    python scripts/glyph_headroom.py --cells finetune-gold-long,finetune-gold    # run the registered cells
    python scripts/glyph_headroom.py --summary                                  # docs/results/headroom.md

Each cell is a recipe `glyphs-<cell>` run as `scripts/glyph_benchmark.py` runs its cells (the same data, data
seed 0, and the same common checkpoint, recipe glyphs-pretrain, seed 1000), one `training.loss_comparison`
call per cell writing docs/results/headroom_<cell>.md with its per-run CSV (each run's commit in its `code`
column). The summary is computed from those committed CSVs and the data's own sibling counts (the chance
level), so it regenerates from a fresh clone.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import glyph_benchmark

from training.evaluation.clone_selection import FAMILY_WITHOUT_MARK, read_clone_selection
from training.loss_comparison.cli import main as compare_losses
from training.loss_comparison.report import read_runs_csv
from training.loss_comparison.stats import paired_difference

PREREGISTRATION = "docs/preregistration_headroom.md"
# The registered cells, in the order they run (recipe glyphs-<cell>; docs/preregistration_headroom.md).
CELLS = ("finetune-gold-long", "finetune-gold", "finetune-weak-long", "finetune-gold-long-16fam")
CONTROLS = "clip,oracle:weight=16,oracle:weight=64,hnnce"
ORACLES = ("oracle:weight=16", "oracle:weight=64")
SEEDS = "20,21,22,23,24"
ENDPOINT = f"clone/{FAMILY_WITHOUT_MARK}"
BAR_CHANCE_FACTOR = 2.0  # clip's mean endpoint at least this many times chance
BAR_GAIN = 0.05  # the oracle's mean paired gain at least this, with its 95% interval above 0
BAR_PAIRS = 5  # a (cell, oracle weight) with fewer pairs is reported, not judged
# Reported beside the endpoint: the marks apart, the whole family, retrieval.
SECONDARY = ("clone/family_mark", "clone/mark", "clone/family", "val/i2t_R@1", "val/t2i_R@1")


def study_name(cell: str) -> str:
    return f"headroom_{cell.replace('-', '_')}"


def headroom_argv(cell: str, seeds: str, output_root: Path, results_dir: Path, extra: Sequence[str]) -> List[str]:
    """The loss comparison's arguments: the glyph benchmark's for `cell`, under this pre-registration."""
    study = study_name(cell)
    argv = glyph_benchmark.cell_argv(cell, study, CONTROLS, seeds, output_root, results_dir, extra)
    argv[argv.index("--preregistration") + 1] = f"{PREREGISTRATION}#{study}"
    return argv


def chance_without_marks(clone_selection_dir: Path) -> float:
    """The endpoint's chance level: the mean over test glyphs of 1 / (non-mark siblings + 1)."""
    shares = [1 / (len(clones[FAMILY_WITHOUT_MARK]) + 1) for _, _, clones in read_clone_selection(clone_selection_dir)]
    return statistics.fmean(shares)


def ok_values(records: Sequence[Mapping[str, Any]], label: str, key: str) -> List[float]:
    return [r["metrics"][key] for r in records if r["label"] == label and r["verdict"] == "ok" and key in r["metrics"]]


def gain_text(records: Sequence[Mapping[str, Any]], label: str, key: str) -> str:
    difference = paired_difference(records, label, "clip", key)
    if difference is None:
        return "n/a"
    return f"{difference.mean:+.3f} {difference.interval_text(0.95)}"


def bar_outcome(records: Sequence[Mapping[str, Any]], oracle: str, chance: float) -> Dict[str, Any]:
    """The registered bar for one (cell, oracle weight): clip learns (mean endpoint >= 2x chance) and the
    oracle's paired gain is >= +0.05 with its 95% interval above 0."""
    clip = statistics.fmean(ok_values(records, "clip", ENDPOINT))
    difference = paired_difference(records, oracle, "clip", ENDPOINT)
    interval = difference.interval(0.95) if difference is not None else None
    learns = clip >= BAR_CHANCE_FACTOR * chance
    gains = difference is not None and difference.mean >= BAR_GAIN and interval is not None and interval[0] > 0
    pairs = difference.n if difference is not None else 0
    return {
        "clip": clip,
        "difference": difference,
        "interval": interval,
        "pairs": pairs,
        "judged": pairs >= BAR_PAIRS,
        "learns": learns,
        "gains": gains,
        "met": learns and gains and pairs >= BAR_PAIRS,
    }


def bar_text(outcome: Mapping[str, Any]) -> str:
    if not outcome["judged"]:
        return f"not judged ({outcome['pairs']} of {BAR_PAIRS} pairs)"
    if outcome["met"]:
        return "**yes**"
    return "no" + ("" if outcome["learns"] else " (clip under 2x chance)")


def summary_lines(results_dir: Path, chance: float, cells: Sequence[str]) -> List[str]:
    """docs/results/headroom.md: per cell and oracle weight, clip's endpoint against chance and the oracle's gain."""
    lines = [
        "# Results: the headroom calibration (positive controls only)",
        "",
        "Generated by `python scripts/glyph_headroom.py --summary` from the committed per-run CSVs "
        "(`headroom_<cell>_runs.csv`, each run's commit in its `code` column) and the glyph data's sibling counts; "
        "design, bar and levers registered first in [preregistration_headroom.md](../preregistration_headroom.md). "
        f"Endpoint: family accuracy without the diacritic-mark siblings (`{ENDPOINT}`); chance "
        f"{chance:.3f} (the mean over the 645 test glyphs of 1 / (non-mark siblings + 1)). Bar: `clip` at least "
        f"{BAR_CHANCE_FACTOR:g}x chance ({BAR_CHANCE_FACTOR * chance:.3f}) and the oracle's paired gain at least "
        f"+{BAR_GAIN:g} with its 95% paired-t interval above 0. Seeds {SEEDS}; differences paired by seed against "
        "`clip`, 95% paired-t interval.",
        "",
        "| cell | oracle | `clip` endpoint | chance | oracle - clip [95%] (pairs) | bar met | HN-NCE - clip (pairs) | "
        + " | ".join(f"oracle - clip, {key}" for key in SECONDARY)
        + " | report |",
        "|---" * (8 + len(SECONDARY)) + "|",
    ]
    for cell in cells:
        study = study_name(cell)
        path = results_dir / f"{study}_runs.csv"
        if not path.is_file():
            lines.append(f"| `{cell}` | not run |" + " |" * (6 + len(SECONDARY)))
            continue
        records = read_runs_csv(path)
        hnnce = paired_difference(records, "hnnce", "clip", ENDPOINT)
        for oracle in ORACLES:
            outcome = bar_outcome(records, oracle, chance)
            lines.append(
                f"| `{cell}` | `{oracle}` | {outcome['clip']:.3f} | {chance:.3f} | "
                f"{gain_text(records, oracle, ENDPOINT)} ({outcome['pairs']}) | {bar_text(outcome)} | "
                f"{gain_text(records, 'hnnce', ENDPOINT)} ({hnnce.n if hnnce else 0}) | "
                + " | ".join(gain_text(records, oracle, key) for key in SECONDARY)
                + f" | [{study}.md]({study}.md) |"
            )
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of {', '.join(CELLS)}")
    parser.add_argument("--seeds", default=SEEDS)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/glyphs"))
    parser.add_argument("--results-dir", type=Path, default=Path("docs/results"))
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the quick budget's, 2)")
    parser.add_argument("--summary", action="store_true", help="write <results-dir>/headroom.md from the CSVs")
    args = parser.parse_args(argv)
    cells = [cell.strip() for cell in args.cells.split(",") if cell.strip()]
    unknown = sorted(set(cells) - set(CELLS))
    if unknown:
        parser.error(f"unknown cell(s) {unknown}; choose from {', '.join(CELLS)}")
    manifest = glyph_benchmark.prepare_data(args.output_dir)
    if args.summary:
        chance = chance_without_marks(args.output_dir / "data" / manifest["clone_selection"])
        page = args.results_dir / "headroom.md"
        page.write_text("\n".join(summary_lines(args.results_dir, chance, CELLS)) + "\n")
        print(f"wrote {page}")
        return
    extra = ["--jobs", str(args.jobs)] if args.jobs else []
    for cell in cells:
        print(f"== {study_name(cell)}", flush=True)
        compare_losses(headroom_argv(cell, args.seeds, args.output_dir, args.results_dir, extra))


if __name__ == "__main__":
    main()

"""The headroom calibration of the glyph benchmark (docs/preregistration_headroom.md): the positive controls
only, on fresh paired seeds, in the cells the pre-registration names, each moving a lever of the frozen
`finetune-gold` cell (which stays as it is), judged on family accuracy without the diacritic-mark siblings.

    python -m studies headroom --cells finetune-gold-long,finetune-gold   # run the registered cells
    python -m studies headroom --summary                                  # docs/results/headroom.md

Each cell is a registered `Study` (`STUDIES`, headroom_<cell>) on the glyph benchmark's data (data seed 0) and
common checkpoint (recipe glyphs-pretrain, seed 1000), with recipe `glyphs-<cell>`; its comparison writes
docs/results/headroom_<cell>.md with its per-run CSV (each run's commit in its `code` column). The summary is
computed from those committed CSVs and the data's own sibling counts (the chance level), so it regenerates from
a fresh clone.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from training.evaluation.clone_selection import FAMILY_WITHOUT_MARK, read_clone_selection

from .command import Command, comparison_flags, names, register_command, report_sections_of, run_or_report
from .comparison import loss_variants, paired_difference, read_runs_csv
from .glyph_benchmark import DATA, PRETRAINING
from .study import STUDIES, Study, register_study

PREREGISTRATION = "docs/preregistration_headroom.md"
# The registered cells, in the order they run (recipe glyphs-<cell>; docs/preregistration_headroom.md).
CELLS = ("finetune-gold-long", "finetune-gold", "finetune-weak-long", "finetune-gold-long-16fam", "finetune-gold-short")
# Cells 1-2 ran with the first controls; the amendment adds the lighter oracle to every cell run after it.
FIRST_CONTROLS = loss_variants("clip", "oracle:weight=16", "oracle:weight=64", "hnnce")
CONTROLS = loss_variants("clip", "oracle:weight=4", "oracle:weight=16", "oracle:weight=64", "hnnce")
RAN_WITH_FIRST_CONTROLS = ("finetune-gold-long", "finetune-gold")
# The cells that ran: their reports and per-run CSVs are committed (the sections checked against the CSVs).
RAN = ("finetune-gold-long", "finetune-gold", "finetune-gold-long-16fam", "finetune-gold-short")
ORACLES = ("oracle:weight=4", "oracle:weight=16", "oracle:weight=64")
SEEDS = (20, 21, 22, 23, 24)
ENDPOINT = f"clone/{FAMILY_WITHOUT_MARK}"
BAR_CHANCE_FACTOR = 2.0  # clip's mean endpoint at least this many times chance
BAR_GAIN = 0.05  # the oracle's mean paired gain at least this, with its 95% interval above 0
BAR_PAIRS = 5  # a (cell, oracle weight) with fewer pairs is reported, not judged
# Reported beside the endpoint: the marks apart, the whole family, retrieval.
SECONDARY = ("clone/family_mark", "clone/mark", "clone/family", "val/i2t_R@1", "val/t2i_R@1")


def study_name(cell: str) -> str:
    return f"headroom_{cell.replace('-', '_')}"


def headroom_study(cell: str) -> Study:
    name = study_name(cell)
    return Study(
        name=name,
        data=DATA,
        recipe=f"glyphs-{cell}",
        variants=FIRST_CONTROLS if cell in RAN_WITH_FIRST_CONTROLS else CONTROLS,
        seeds=SEEDS,
        preregistration=PREREGISTRATION,
        endpoints=(name,),
        report=f"docs/results/{name}.md",
        pretraining=PRETRAINING,
    )


for _cell in CELLS:
    register_study(headroom_study(_cell))


def headroom_studies(cells: Sequence[str]) -> List[Study]:
    return [STUDIES.get(study_name(cell)) for cell in cells]


def chance_without_marks(clone_selection_dir: Path) -> float:
    """The endpoint's chance level: the mean over test glyphs of 1 / (non-mark siblings + 1)."""
    shares = [1 / (len(clones[FAMILY_WITHOUT_MARK]) + 1) for _, _, clones in read_clone_selection(clone_selection_dir)]
    return statistics.fmean(shares)


def ok_values(outcomes: Sequence[Mapping[str, Any]], label: str, key: str) -> List[float]:
    return [r["metrics"][key] for r in outcomes if r["label"] == label and r["verdict"] == "ok" and key in r["metrics"]]


def gain_text(outcomes: Sequence[Mapping[str, Any]], label: str, key: str) -> str:
    difference = paired_difference(outcomes, label, "clip", key)
    if difference is None:
        return "n/a"
    return f"{difference.mean:+.3f} {difference.interval_text(0.95)}"


def bar_outcome(outcomes: Sequence[Mapping[str, Any]], oracle: str, chance: float) -> Dict[str, Any]:
    """The registered bar for one (cell, oracle weight): clip learns (mean endpoint >= 2x chance) and the
    oracle's paired gain is >= +0.05 with its 95% interval above 0."""
    clip = statistics.fmean(ok_values(outcomes, "clip", ENDPOINT))
    difference = paired_difference(outcomes, oracle, "clip", ENDPOINT)
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
        "Generated by `python -m studies headroom --summary` from the committed per-run CSVs "
        "(`headroom_<cell>_runs.csv`, each run's commit in its `code` column) and the glyph data's sibling counts; "
        "design, bar and levers registered first in [preregistration_headroom.md](../preregistration_headroom.md). "
        f"Endpoint: family accuracy without the diacritic-mark siblings (`{ENDPOINT}`); chance "
        f"{chance:.3f} (the mean over the 645 test glyphs of 1 / (non-mark siblings + 1)). Bar: `clip` at least "
        f"{BAR_CHANCE_FACTOR:g}x chance ({BAR_CHANCE_FACTOR * chance:.3f}) and the oracle's paired gain at least "
        f"+{BAR_GAIN:g} with its 95% paired-t interval above 0. Seeds {','.join(map(str, SEEDS))}; differences paired by seed against "
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
        outcomes = read_runs_csv(path)
        hnnce = paired_difference(outcomes, "hnnce", "clip", ENDPOINT)
        for oracle in (oracle for oracle in ORACLES if ok_values(outcomes, oracle, ENDPOINT)):
            bar = bar_outcome(outcomes, oracle, chance)
            lines.append(
                f"| `{cell}` | `{oracle}` | {bar['clip']:.3f} | {chance:.3f} | "
                f"{gain_text(outcomes, oracle, ENDPOINT)} ({bar['pairs']}) | {bar_text(bar)} | "
                f"{gain_text(outcomes, 'hnnce', ENDPOINT)} ({hnnce.n if hnnce else 0}) | "
                + " | ".join(gain_text(outcomes, oracle, key) for key in SECONDARY)
                + f" | [{study}.md]({study}.md) |"
            )
    return lines


def write_summary(output_root: Path, results_dir: Path) -> Path:
    """<results-dir>/headroom.md from the committed per-run CSVs and the glyph data (written once into
    <output-root>/data) for the chance level."""
    manifest = DATA.prepare(output_root)
    chance = chance_without_marks(DATA.folder(output_root) / manifest["clone_selection"])
    page = results_dir / "headroom.md"
    page.write_text("\n".join(summary_lines(results_dir, chance, CELLS)) + "\n")
    return page


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", default=None, help=f"comma-separated, of {', '.join(CELLS)}")
    parser.add_argument(
        "--summary", action="store_true", help="<results-dir>/headroom.md from the per-run CSVs and the glyph data"
    )
    comparison_flags(parser, "runs/glyphs", "default: the registered seeds (20-24)")


def run(args: argparse.Namespace) -> None:
    cells = names(args.cells, CELLS, "cell")
    if args.summary:
        print(f"wrote {write_summary(args.output_dir, args.results_dir or Path('docs/results'))}")
        return
    run_or_report(headroom_studies(cells), args)


register_command(
    Command(
        "headroom",
        __doc__,
        run,
        options,
        section_reports={
            name: spec for cell in RAN for name, spec in report_sections_of(STUDIES.get(study_name(cell))).items()
        },
    )
)

"""The glyph benchmark (docs/glyphs.md): real font glyphs in families of one-attribute siblings, a calibration
grid on the positive controls, then every loss on the frozen cell, on paired seeds.

    python -m studies glyphs --calibrate                      # the grid: clip, oracle, hnnce, seeds 0-2
    python -m studies glyphs --cells finetune-gold --seeds 10-19
    python -m studies glyphs --report-only --cells finetune-weak
    python -m studies glyphs --summary --cells finetune-gold  # docs/results/glyphs.md from the CSVs

Each cell is a recipe of the lab (`studies.recipes`: glyphs-<cell>) on the data `python -m studies.glyphs`
writes (data seed 0, written once into <output-dir>/data); the fine-tuning cells start every run from one common
checkpoint, `clip` trained with recipe glyphs-pretrain (seed 1000, written once into <output-dir>/pretrain).
Each (cell, calibration or frozen) is a registered `Study` (`STUDIES`, glyphs_<cell> and
glyphs_calibration_<cell>): its comparison runs into <output-dir>/<study> and writes
<results-dir>/<study>.md with its plot and per-run CSV; the endpoint, margin and reference are the
pre-registered ones (docs/preregistration_glyphs.md#<study>). The summary is computed from those committed
per-run CSVs alone (the run folders are not committed), so it regenerates from a fresh clone: `python -m studies
reports` writes it and the frozen cells' reports (`FROZEN_CELLS`) again.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from open_clip_adacl import get_loss_class

from .command import Command, comparison_flags, names, register_command, run_or_report
from .comparison import OK, loss_variants, paired_difference, primary_verdict, read_runs_csv, rendered_again
from .data import GlyphData
from .pretraining import Pretraining
from .study import STUDIES, Study, register_study

PREREGISTRATION = "docs/preregistration_glyphs.md"
CELLS = ("scratch-weak", "finetune-weak", "finetune-gold")  # the calibration grid (recipes glyphs-<cell>)
CONTROLS = loss_variants("clip", "oracle:weight=16", "hnnce")
# The frozen benchmark's variants, in the registered order (docs/preregistration_glyphs.md).
VARIANTS = CONTROLS + loss_variants("adacl", "adacl:preset=paper", "adacl:positive_grad=fixed", "adaclw")
# The cells whose frozen benchmark ran: their reports and per-run CSVs are committed, and `python -m studies
# reports` writes them again.
FROZEN_CELLS = ("finetune-gold",)
CALIBRATION_SEEDS, FROZEN_SEEDS = (0, 1, 2), tuple(range(10, 20))
ENDPOINT = "clone/family"
ORACLE = "oracle:weight=16"
# Secondary columns of the summary: pairwise sibling accuracy, retrieval, the closest sibling's cosine margin.
SECONDARY = ("clone/overall", "clone/mark", "ret/glyph_retrieval/image_R@1", "clone/family_cos_margin")
DATA = GlyphData(seed=0)
# The fine-tuning cells' common checkpoint: `clip` on the weak captions, once.
PRETRAINING = Pretraining("clip-seed1000", "glyphs-pretrain", 1000, DATA, log_every_n_steps=32)
COMMAND = "python -m studies glyphs"


def study_name(cell: str, calibrate: bool) -> str:
    return f"glyphs_calibration_{cell.replace('-', '_')}" if calibrate else f"glyphs_{cell.replace('-', '_')}"


def glyph_study(cell: str, calibrate: bool) -> Study:
    name = study_name(cell, calibrate)
    return Study(
        name=name,
        data=DATA,
        recipe=f"glyphs-{cell}",
        variants=CONTROLS if calibrate else VARIANTS,
        seeds=CALIBRATION_SEEDS if calibrate else FROZEN_SEEDS,
        preregistration=PREREGISTRATION,
        endpoints=(name,),
        report=f"docs/results/{name}.md",
        pretraining=PRETRAINING if cell.startswith("finetune") else None,
    )


for _cell in CELLS:
    for _calibrate in (True, False):
        register_study(glyph_study(_cell, _calibrate))


def glyph_studies(cells: Sequence[str], calibrate: bool) -> List[Study]:
    return [STUDIES.get(study_name(cell, calibrate)) for cell in cells]


def study_outcomes(results_dir: Path, study: str) -> List[Dict[str, Any]]:
    """The outcomes of a study's runs as its committed per-run CSV holds them (<results-dir>/<study>_runs.csv,
    written with its report; verdicts as the report judged them); [] before the study ran."""
    path = results_dir / f"{study}_runs.csv"
    return read_runs_csv(path) if path.is_file() else []


REGISTERED = [variant.label for variant in VARIANTS]


def labels_in_order(outcomes: Sequence[Mapping[str, Any]]) -> List[str]:
    """The variants in the registered order, then any others (exploratory looks), in the order of their outcomes."""
    found = list(dict.fromkeys(outcome["label"] for outcome in outcomes))
    return [label for label in REGISTERED if label in found] + [label for label in found if label not in REGISTERED]


def difference_text(outcomes: Sequence[Mapping[str, Any]], label: str, key: str) -> str:
    difference = paired_difference(outcomes, label, "clip", key)
    if difference is None:
        return "n/a"
    return f"{difference.mean:+.3f} {difference.interval_text(0.95)} ({difference.n})"


def mean_text(outcomes: Sequence[Mapping[str, Any]], label: str, key: str) -> str:
    values = [
        r["metrics"][key] for r in outcomes if r["label"] == label and r["verdict"] == "ok" and key in r["metrics"]
    ]
    if not values:
        return "n/a"
    spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.3f}{spread}"


def mechanism_text(outcomes: Sequence[Mapping[str, Any]], label: str) -> str:
    """The share of logged steps in which each mechanism the variant's loss declares (`Loss.mechanism_stats`, e.g.
    AdaCL's guards and bounds) acted, averaged over its ok runs as the per-run CSV holds them; `-` for a loss
    that declares none or whose outcomes hold none."""
    runs = [r for r in outcomes if r["label"] == label and r["verdict"] == OK]
    stats = get_loss_class(runs[0]["loss"]).mechanism_stats if runs else None
    parts = []
    for name in stats.fractions if stats else ():
        values = [r["metrics"][f"{stats.prefix}/{name}"] for r in runs if f"{stats.prefix}/{name}" in r["metrics"]]
        if values:
            parts.append(f"{name} {statistics.fmean(values):.3g}")
    return ", ".join(parts) or "-"


def verdict_text(outcomes: Sequence[Mapping[str, Any]], label: str, margin: float, beyond_margin: bool) -> str:
    """The primary endpoint's verdict against `clip`: outside 0 (as the runs' report judged it) or outside
    the margin (`beyond_margin`, as docs/preregistration_glyphs.md registers it)."""
    return primary_verdict(paired_difference(outcomes, label, "clip", ENDPOINT), margin, beyond_margin)[0]


def oracle_share(outcomes: Sequence[Mapping[str, Any]], label: str) -> str:
    """(variant - clip) / (oracle - clip) on the paired means of the endpoint: the share of the oracle's gain."""
    oracle, mine = (
        paired_difference(outcomes, ORACLE, "clip", ENDPOINT),
        paired_difference(outcomes, label, "clip", ENDPOINT),
    )
    if oracle is None or mine is None or oracle.mean <= 0:
        return "n/a"
    return f"{mine.mean / oracle.mean:.0%}"


def summary_lines(results_dir: Path, cells: Sequence[str]) -> List[str]:
    """docs/results/glyphs.md: the calibration grid, then each frozen cell's variants, from the committed
    per-run CSVs in `results_dir` alone."""
    lines = [
        "# Results: the glyph benchmark",
        "",
        "Generated by `python -m studies glyphs --summary` from the committed per-run CSVs "
        "(`<study>_runs.csv` beside each report; the run folders are not committed); the design, "
        "endpoints and freezing rule were committed first in [preregistration_glyphs.md](../preregistration_glyphs.md); "
        "the data and endpoints are described in [glyphs.md](../glyphs.md). Differences are paired by seed (same "
        "initialisation and data order) against `clip`, with their 95% paired-t interval and the number of "
        "pairs; the endpoint is held-out family accuracy (`clone/family`, chance about 0.125).",
        "",
        "## Calibration grid: the positive controls",
        "",
        "| cell | `clip` family acc. | oracle - clip | HN-NCE - clip | `clip` pairwise acc. | oracle - clip, pairwise | "
        "HN-NCE - clip, pairwise | report |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in CELLS:
        study = study_name(cell, True)
        outcomes = study_outcomes(results_dir, study)
        if not outcomes:
            lines.append(f"| `{cell}` | not run | | | | | | |")
            continue
        lines.append(
            f"| `{cell}` | {mean_text(outcomes, 'clip', ENDPOINT)} | {difference_text(outcomes, ORACLE, ENDPOINT)} | "
            f"{difference_text(outcomes, 'hnnce', ENDPOINT)} | {mean_text(outcomes, 'clip', 'clone/overall')} | "
            f"{difference_text(outcomes, ORACLE, 'clone/overall')} | "
            f"{difference_text(outcomes, 'hnnce', 'clone/overall')} | [{study}.md]({study}.md) |"
        )
    for cell in cells:
        study = study_name(cell, False)
        outcomes = study_outcomes(results_dir, study)
        if not outcomes:
            continue
        margin = STUDIES.get(study).registration().margin
        lines += [
            "",
            f"## The frozen benchmark: `{cell}`",
            "",
            f"Full report with every secondary test (Holm-corrected): [{study}.md]({study}.md); per-run "
            f"numbers: [{study}_runs.csv]({study}_runs.csv). Two readings of the verdict: *outside 0* "
            "(helps when the 95% interval lies above 0, hurts below 0; the loss comparison's rule, which "
            f"judged the runs' report) and *outside ±{margin:g}* (helps only when it lies above +{margin:g}, "
            f'hurts below -{margin:g}: "above 0 and outside the margin", as the pre-registration words '
            "it); both call a 90% interval inside the margin no effect (TOST). Mechanism: AdaCL's guard and "
            "bound rates, the share of logged steps, from the per-run CSV; the other losses' per-step stats "
            "are not in the committed per-run CSV.",
            "",
            "| variant | runs ok | family acc. | - clip [95%] (pairs) | verdict, outside 0 | "
            f"verdict, outside ±{margin:g} (registered) | share of the oracle's gain | "
            + " | ".join(f"{key} - clip" for key in SECONDARY)
            + " | mechanism (share of steps) |",
            "|---" * (7 + len(SECONDARY) + 1) + "|",
        ]
        for label in labels_in_order(outcomes):
            runs = [r for r in outcomes if r["label"] == label]
            ok = sum(r["verdict"] == OK for r in runs)
            reference = label == "clip"
            registered = "" if label in REGISTERED else " (exploratory)"
            verdicts = (
                ["", ""] if reference else [verdict_text(outcomes, label, margin, beyond) for beyond in (False, True)]
            )
            lines.append(
                f"| `{label}`{registered} | {ok}/{len(runs)} | {mean_text(outcomes, label, ENDPOINT)} | "
                f"{'(reference)' if reference else difference_text(outcomes, label, ENDPOINT)} | "
                f"{verdicts[0]} | {verdicts[1]} | {'' if reference else oracle_share(outcomes, label)} | "
                + " | ".join("" if reference else difference_text(outcomes, label, key) for key in SECONDARY)
                + f" | {mechanism_text(outcomes, label)} |"
            )
    return lines


def render_reports_again(results_dir: Path) -> List[Path]:
    """Each glyph report in `results_dir` whose per-run CSV is there, its sections rendered again from that CSV
    under its registration as amended after the runs (docs/preregistration_glyphs.md: the verdict rule and the
    secondary family as registered), its header as first written; returns the reports."""
    pages = []
    for calibrate in (True, False):
        for cell in CELLS:
            study = study_name(cell, calibrate)
            page, runs_csv = results_dir / f"{study}.md", results_dir / f"{study}_runs.csv"
            if not (page.is_file() and runs_csv.is_file()):
                continue
            registration = STUDIES.get(study).registration()
            rule = (
                f"the verdict rule as registered (helps or hurts only outside ±{registration.margin:g}) and "
                if registration.helps_beyond_margin
                else ""
            )
            note = (
                f"the lines above are as first written; every section below is rendered again from "
                f"[{runs_csv.name}]({runs_csv.name}) (the run folders are not committed) by "
                f"`{COMMAND} --summary`, under {rule}the registered secondary family "
                "(docs/preregistration_glyphs.md, amendment after the runs); the runs' verdicts are the CSV's, "
                "as first judged (none collapsed)."
            )
            rendered_again(page, read_runs_csv(runs_csv), registration, note)
            pages.append(page)
    return pages


def write_summary(results_dir: Path, cells: Sequence[str]) -> List[Path]:
    """Every glyph report rendered again from its per-run CSV, then glyphs.md; returns the pages written."""
    pages = render_reports_again(results_dir)
    summary = results_dir / "glyphs.md"
    summary.write_text("\n".join(summary_lines(results_dir, cells)) + "\n")
    return [*pages, summary]


def options(parser: argparse.ArgumentParser) -> None:
    controls = ", ".join(variant.label for variant in CONTROLS)
    parser.add_argument("--calibrate", action="store_true", help=f"the calibration grid ({controls})")
    parser.add_argument("--cells", default=None, help=f"comma-separated, of {', '.join(CELLS)}")
    parser.add_argument(
        "--summary",
        action="store_true",
        help="from the per-run CSVs in <results-dir>: each glyph report's sections rendered again, and glyphs.md",
    )
    comparison_flags(parser, "runs/glyphs", "default: each study's registered seeds")


def run(args: argparse.Namespace) -> None:
    cells = names(args.cells, CELLS, "cell")
    if args.summary:
        for page in write_summary(args.results_dir or Path("docs/results"), cells):
            print(f"wrote {page}")
        return
    run_or_report(glyph_studies(cells, args.calibrate), args)


register_command(
    Command(
        "glyphs",
        __doc__,
        run,
        options,
        reports=lambda docs: write_summary(docs / "results", FROZEN_CELLS),
    )
)

"""The studies' committed reports, written again from committed files alone (the per-run CSVs beside them).

`write_reports(docs)` renders every report whose runs' folders are not committed from its per-run CSV: the glyph
reports and their summary (`glyph_benchmark.write_summary`), the clone study's cell reports, reassessed.md and
RESULTS.md (`reassessment.reassess`); tests/training/studies/test_reports.py checks that a fresh clone writes
them byte for byte as committed. `redraw` draws a comparison report's plot again from its per-run CSV, each run
judged as the report judged it (the CSV's verdict column) and with the report's margin and reference: for plots
drawn before the plot showed the equivalence band.

    python -m training.studies redraw docs/results/controls.md docs/results/glyphs_finetune_gold.md ...
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from training.loss_comparison import (
    Preregistration,
    from_file,
    read_runs_csv,
    report_sections,
    summarize,
    write_plot,
)

from .glyph_benchmark import write_summary
from .reassessment import outcomes_from_csv, reassess
from .study import ROOT

# The glyph cells whose frozen benchmark ran (their reports and per-run CSVs are committed).
FROZEN_GLYPH_CELLS = ("finetune-gold",)
# Comparison reports written from run folders that are not committed, each with the registration its sections
# were judged under (None: the comparison's defaults): every section, from `## Summary` on, is what the
# per-run CSV committed beside it renders (`sections_again`); the header (how, where and when the runs ran) is
# as first written.
SECTION_REPORTS = {
    "cells_one_commit": None,
    "controls": "docs/preregistration.md#controls",
    "controls_bank": None,
    "controls_paper": "docs/preregistration.md#controls",
    "controls_pseudo": "docs/preregistration.md#controls_pseudo",
    "controls_readings": "docs/preregistration.md#controls",
    "controls_scratch2": "docs/preregistration.md#controls_scratch2",
    "controls_transfer": "docs/preregistration.md#controls_transfer",
    "headroom_finetune_gold": "docs/preregistration_headroom.md#headroom_finetune_gold",
    "headroom_finetune_gold_long": "docs/preregistration_headroom.md#headroom_finetune_gold_long",
    "headroom_finetune_gold_long_16fam": "docs/preregistration_headroom.md#headroom_finetune_gold_long_16fam",
    "headroom_finetune_gold_short": "docs/preregistration_headroom.md#headroom_finetune_gold_short",
    "loss_table": "docs/preregistration_headroom.md#discovery_loss_table",
    "margins_transfer": "docs/preregistration_margins.md#margins_transfer",
    "margins_transfer_shape": "docs/preregistration_margins.md#margins_transfer_shape",
}


def as_judged(outcome: Dict[str, Any]) -> Dict[str, Any]:
    """The CSV's run with the verdict and reasons its report gave it."""
    reasons = [reason for reason in (outcome["previous_reasons"] or "").split("; ") if reason]
    return {**outcome, "verdict": outcome["previous_verdict"], "reasons": reasons}


def redraw(report: Path) -> Path:
    """Write REPORT's plot (REPORT with .png) again from REPORT's _runs.csv; the plot's path."""
    text = report.read_text()
    margin = float(re.search(r"margin ±([0-9.]+)", text).group(1))
    reference = re.search(r"reference `([^`]+)`", text).group(1)
    outcomes = [as_judged(outcome) for outcome in outcomes_from_csv(report.with_name(f"{report.stem}_runs.csv"))]
    plot = report.with_suffix(".png")
    write_plot(summarize(outcomes), outcomes, reference, plot, margin)
    return plot


def registration_of(spec: Optional[str]) -> Preregistration:
    if spec is None:
        return Preregistration()
    return replace(from_file(str(ROOT / spec)), source=spec)


def sections_again(page: Path, registration: Preregistration, missing: Sequence[str] = ()) -> str:
    """The sections of comparison report `page`, from `## Summary` on, rendered from the per-run CSV beside it
    (each run with the verdict the report gave it) under `registration`; `missing`: the planned runs that never
    finished, which the CSV (finished runs only) cannot name."""
    outcomes = read_runs_csv(page.with_name(f"{page.stem}_runs.csv"))
    plot = page.with_suffix(".png")
    name = plot.name if plot.is_file() else None
    csv_name = f"{page.stem}_runs.csv"
    return "\n".join(report_sections(summarize(outcomes), outcomes, name, csv_name, registration, missing))


def write_reports(docs: Path) -> List[Path]:
    """Every study report of `docs` (a copy of the repository's docs/) written again from its committed per-run
    CSVs; returns the files written."""
    results = docs / "results"
    pages = write_summary(results, FROZEN_GLYPH_CELLS)
    reassessed = reassess(results, docs / "RESULTS.md")
    return [*pages, reassessed, docs / "RESULTS.md"]

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
from pathlib import Path
from typing import Any, Dict, List

from training.loss_comparison import summarize, write_plot

from .glyph_benchmark import write_summary
from .reassessment import outcomes_from_csv, reassess

# The glyph cells whose frozen benchmark ran (their reports and per-run CSVs are committed).
FROZEN_GLYPH_CELLS = ("finetune-gold",)


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


def write_reports(docs: Path) -> List[Path]:
    """Every study report of `docs` (a copy of the repository's docs/) written again from its committed per-run
    CSVs; returns the files written."""
    results = docs / "results"
    pages = write_summary(results, FROZEN_GLYPH_CELLS)
    reassessed = reassess(results, docs / "RESULTS.md")
    return [*pages, reassessed, docs / "RESULTS.md"]

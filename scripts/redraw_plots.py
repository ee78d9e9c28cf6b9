"""Redraw loss-comparison reports' plots from their committed per-run CSVs, each run judged as its report judged it
(the CSV's verdict column) and with the report's equivalence margin and reference: for plots drawn before the plot
showed the equivalence band, whose run folders are not in the repository (so `--report-only` cannot redraw them).

    python scripts/redraw_plots.py docs/results/controls.md docs/results/glyphs_finetune_gold.md ...
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Dict

from reassess_study import records_from_csv

from training.loss_comparison.report import write_plot
from training.loss_comparison.stats import summarize


def as_judged(record: Dict[str, Any]) -> Dict[str, Any]:
    """The CSV's run with the verdict and reasons its report gave it."""
    reasons = [reason for reason in (record["previous_reasons"] or "").split("; ") if reason]
    return {**record, "verdict": record["previous_verdict"], "reasons": reasons}


def redraw(report: Path) -> Path:
    """Write REPORT's plot (REPORT with .png) again from REPORT's _runs.csv; the plot's path."""
    text = report.read_text()
    margin = float(re.search(r"margin ±([0-9.]+)", text).group(1))
    reference = re.search(r"reference `([^`]+)`", text).group(1)
    records = [as_judged(record) for record in records_from_csv(report.with_name(f"{report.stem}_runs.csv"))]
    plot = report.with_suffix(".png")
    write_plot(summarize(records), records, reference, plot, margin)
    return plot


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", type=Path, nargs="+", help="report pages, each beside its _runs.csv")
    for report in parser.parse_args().reports:
        print(f"wrote {redraw(report)}")

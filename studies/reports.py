"""The studies' committed reports, written again from committed files alone (the per-run CSVs beside them).

`write_reports(docs)` runs every command's report writer (`Command.reports`), each rendering reports whose runs'
folders are not committed from their per-run CSVs (the glyph reports and their summary, the loss table's shares,
the clone study's cell reports, reassessed.md and RESULTS.md); tests/studies/test_reports.py checks that a fresh
clone writes them byte for byte as committed. `section_reports()` gathers every command's comparison reports
whose sections the per-run CSV beside them renders (`Command.section_reports`; the test checks each). `redraw`
draws a comparison report's plot again from its per-run CSV, each run judged as the report judged it (the CSV's
verdict column) and with the report's margin and reference: for plots drawn before the plot showed the
equivalence band.

    python -m studies reports                                              # every report, from committed files
    python -m studies redraw docs/results/controls.md docs/results/glyphs_finetune_gold.md ...
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .command import COMMANDS, Command, register_command
from .comparison import (
    Preregistration,
    from_file,
    read_runs_csv,
    report_sections,
    summarize,
    write_plot,
)
from .reassessment import outcomes_from_csv
from .study import ROOT


def section_reports() -> Dict[str, Optional[str]]:
    """Every command's comparison reports written from run folders that are not committed, each with the
    registration its sections were judged under (None: the comparison's defaults): every section, from
    `## Summary` on, is what the per-run CSV committed beside it renders (`sections_again`); the header (how,
    where and when the runs ran) is as first written. A report two commands name is an error."""
    found: Dict[str, Optional[str]] = {}
    for name, command in COMMANDS.items():
        twice = sorted(set(found) & set(command.section_reports))
        if twice:
            raise ValueError(f"command {name!r} names section reports another command names: {twice}")
        found.update(command.section_reports)
    return found


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


def write_reports(docs: Path, only: Optional[Sequence[str]] = None) -> List[Path]:
    """Every study report of `docs` (a copy of the repository's docs/) written again from its committed per-run
    CSVs, by each command's report writer in the order the commands registered (`only`: those commands'
    writers); returns the files written."""
    writers = [name for name, command in COMMANDS.items() if command.reports]
    unknown = sorted(set(only or ()) - set(writers))
    if unknown:
        raise ValueError(f"no command {unknown} writes reports; those that do: {', '.join(writers)}")
    return [page for name in writers if only is None or name in only for page in COMMANDS.get(name).reports(docs)]


def reports_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="the docs folder whose reports to rewrite")
    parser.add_argument(
        "--commands", default=None, help="comma-separated: only these commands' reports (default: every command's)"
    )


def write_every_report(args: argparse.Namespace) -> None:
    only = [name.strip() for name in args.commands.split(",")] if args.commands else None
    for page in write_reports(args.docs, only):
        print(f"wrote {page}")


def redraw_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reports", type=Path, nargs="+", help="report pages, each beside its _runs.csv")


def redraw_each(args: argparse.Namespace) -> None:
    for report in args.reports:
        print(f"wrote {redraw(report)}")


register_command(Command("reports", __doc__, write_every_report, reports_options))
register_command(
    Command(
        "redraw",
        "A comparison report's plot drawn again from its per-run CSV, its runs judged as the report judged them.\n\n"
        + __doc__,
        redraw_each,
        redraw_options,
    )
)

"""The clone study's committed runs judged again: the collapse rule and the secondary family of the
pre-registration's amendment (docs/preregistration.md), from the per-run CSVs the reports committed.

    python -m studies reassess   # writes docs/results/reassessed.md, rewrites the cell reports and RESULTS.md

The run folders behind docs/results/<cell>_runs.csv are not in the repository, so the reports cannot be
regenerated with `--report-only`; every number the reports' sections need is in the CSVs. So each cell's
report keeps its header as first written (how, where and when its runs ran) and gets every section from
`## Summary` on rendered again from its CSV under the amended rules, its plot redrawn; RESULTS.md repeats
those sections (studies.clone_study). reassessed.md lists the runs whose verdict changed. Those runs
recorded no code version per run (their reports name one source tree with uncommitted changes), so their
pairs are made across unknown code, and every table says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .clone_study import CELLS, READ_FIRST, kept_section_lines
from .command import Command, register_command
from .comparison import (
    KEEP_MARKER,
    Preregistration,
    assess_run,
    paired_section,
    primary_table,
    read_runs_csv,
    rendered_again,
    summarize,
    with_endpoint,
)
from .study import STUDIES

STUDIED_CELLS = ("scratch", "transfer", "pseudo")
BATCH_SIZE, VAL_SAMPLES = 64, 512  # the study's design (docs/preregistration.md), in every report's header


def outcomes_from_csv(path: Path) -> List[Dict[str, Any]]:
    """Run outcomes as the comparison wrote them, rebuilt from a report's per-run CSV (runs that failed or went
    non-finite keep that status; every other run is judged again)."""
    outcomes = []
    for row in read_runs_csv(path):
        status = row["verdict"] if row["verdict"] in ("failed", "nonfinite") else "ok"
        reasons = "; ".join(row["reasons"])
        outcomes.append(
            {
                "label": row["label"],
                "loss": row["loss"],
                "options": row["options"],
                "seed": row["seed"],
                "name": row["name"],
                "code": row["code"],
                "status": status,
                "error": reasons or None,
                "batch_size": BATCH_SIZE,
                "val_num_samples": VAL_SAMPLES,
                "previous_verdict": row["verdict"],
                "previous_reasons": reasons,
                "metrics": row["metrics"],
            }
        )
    return outcomes


def judged_outcomes(results: Path, cell: str) -> Tuple[List[Dict[str, Any]], Preregistration]:
    """The cell's runs from its CSV, judged by the amended collapse rule, with the registered endpoint."""
    outcomes = [assess_run(outcome) for outcome in outcomes_from_csv(results / f"{cell}_runs.csv")]
    preregistration = STUDIES.get(cell).registration()
    return with_endpoint(outcomes, preregistration.metrics, preregistration.key), preregistration


def rewrite_report(results: Path, cell: str, outcomes: List[Dict[str, Any]], preregistration: Preregistration) -> str:
    """The cell's report with its header as first written and every section rendered again from its judged
    `outcomes` (its plot redrawn beside it); returns the new text, also written to results/<cell>.md."""
    note = (
        f"the lines above are as first written, but for the runs' summed time, added from the "
        f"CSV; every section below is rendered again from [{cell}_runs.csv]({cell}_runs.csv) by "
        "`python -m studies reassess`, under the amended collapse rule and registered secondary family "
        "(docs/preregistration.md); the CSV's verdict column is the first judgment "
        "([reassessed.md](reassessed.md) lists the runs it changed)."
    )
    return rendered_again(results / f"{cell}.md", outcomes, preregistration, note)


def refresh_results_md(results_md: Path, reports: Dict[str, str]) -> None:
    """RESULTS.md's read-first paragraph and each cell's repeated sections (`clone_study.kept_section_lines`)
    from the rewritten reports; its setup lines, which need the run folders, stay as they are."""
    text = results_md.read_text()
    start = text.index("**Read first:**")
    text = text[:start] + READ_FIRST + text[text.index("\n", start) :]
    for cell, report in reports.items():
        heading = text.index(f"## {CELLS[cell].title} (`{cell}`)\n")
        first = text.index("\n### ", heading) + 1
        # up to the next section, or to the part below KEEP_MARKER that clone_study.assemble keeps
        end = min(
            (index + 1 for index in (text.find("\n## ", first), text.find("\n" + KEEP_MARKER, first)) if index >= 0),
            default=len(text),
        )
        text = text[:first] + "\n".join(kept_section_lines(report)) + "\n" + text[end:]
    results_md.write_text(text)


def cell_lines(cell: str, outcomes: List[Dict[str, Any]], preregistration: Preregistration) -> List[str]:
    """The cell's part of reassessed.md: its collapse counts, the runs whose verdict changed, its pairs."""
    labels = list(dict.fromkeys(outcome["label"] for outcome in outcomes))
    changed = [
        f"| `{r['label']}` | {r['seed']} | {r['previous_verdict']} | **{r['verdict']}** | "
        f"{'; '.join(r['reasons']) or '-'} | {r['metrics'].get('train/final_loss', float('nan')):.3f} | "
        f"{r['metrics']['val/clip_loss']:.3f} |"
        for r in outcomes
        if r["verdict"] != r["previous_verdict"]
    ]
    collapsed = {label: sum(r["verdict"] == "collapsed" for r in outcomes if r["label"] == label) for label in labels}
    lines = [
        f"## {cell}",
        "",
        f"From [{cell}_runs.csv]({cell}_runs.csv); the report itself, [{cell}.md]({cell}.md), is "
        "rendered again from it. Collapsed runs per variant under the amended rule: "
        + ", ".join(
            f"`{label}` {count}/{sum(r['label'] == label for r in outcomes)}" for label, count in collapsed.items()
        )
        + ".",
        "",
    ]
    if changed:
        lines += [
            "Runs whose verdict changed:",
            "",
            "| variant | seed | earlier verdict | amended verdict | why | training loss | val CLIP loss |",
            "|---|---|---|---|---|---|---|",
            *changed,
            "",
        ]
    else:
        lines += ["No run's verdict changed.", ""]
    lines += [
        "### Primary endpoint, pairs made again",
        "",
        f"`{preregistration.definition}`, margin ±{preregistration.margin:g}, reference `clip`; each pair's "
        "code is unknown (recorded per report, not per run).",
        "",
        *primary_table(outcomes, labels, "clip", preregistration),
        "",
    ]
    paired = paired_section(outcomes, summarize(outcomes), "clip", preregistration)
    return lines + ["#" + line if line.startswith("## ") else line for line in paired]


def reassess(results_dir: Path, results_md: Path) -> Path:
    """Judge the clone study's committed runs again: rewrite each cell's report in `results_dir` and the
    sections RESULTS.md (`results_md`) repeats, and write reassessed.md beside the reports; returns it."""
    lines = [
        "# The clone study's runs, judged by the amended rules",
        "",
        "Generated by `python -m studies reassess` from the committed per-run CSVs. Collapse, one rule for "
        "every cell: mean val R@1 below 2 x chance (1/512), or the final val CLIP loss within 5% of ln(64) "
        "(its chance value at the study's val batch of 64) with mean val R@1 below 3 x chance (a model at "
        "chance reaches 3 x in under 2% of runs), whatever the training loss (docs/preregistration.md, second "
        "amendment). Secondary tests: exactly the registered "
        "family (per edit type accuracy, cosine margin and its 10th percentile; val R@1), Holm-corrected per "
        "cell (docs/preregistration.md, amendment).",
        "",
    ]
    reports = {}
    for cell in STUDIED_CELLS:
        outcomes, preregistration = judged_outcomes(results_dir, cell)
        lines += cell_lines(cell, outcomes, preregistration)
        reports[cell] = rewrite_report(results_dir, cell, outcomes, preregistration)
    output = results_dir / "reassessed.md"
    output.write_text("\n".join(lines) + "\n")
    refresh_results_md(results_md, reports)
    return output


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results-dir", type=Path, default=Path("docs/results"))
    parser.add_argument("--results-md", type=Path, default=Path("docs/RESULTS.md"))


def run(args: argparse.Namespace) -> None:
    print(f"wrote {reassess(args.results_dir, args.results_md)}")


register_command(
    Command(
        "reassess",
        __doc__,
        run,
        options,
        reports=lambda docs: [reassess(docs / "results", docs / "RESULTS.md"), docs / "RESULTS.md"],
    )
)
